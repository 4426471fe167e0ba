"""A person's view: headless Chromium follows a job on the dashboard from the start to DONE.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them with apt when it
can). Saves ``tests/artifacts/dashboard-*.png``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from bucketlearn import layout
from bucketlearn.bootstrap import google_services

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser() -> Any:
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing: `make test` installs them "
                        "(apt-get install chromium chromium-driver)")
        pytest.skip("chromium / chromedriver not installed (apt-get install chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,2000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def page_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def test_dashboard_follows_a_job_to_done(make_stack: Any, browser: Any) -> None:
    # Prepare
    stack = make_stack("dash", workers=2, dashboard=True)
    svc = google_services(stack.settings)
    digits = REPO / "data" / "digits.csv"
    info = svc.store.write_file(stack.settings.uploads_bucket, "digits.csv", str(digits),
                                "text/csv", {"epochs": "3"})
    job_id = layout.job_id_for(info.bucket, info.name, info.generation)
    # Execute: open the job page while it trains; it refreshes by itself (no reload here)
    browser.get(f"{stack.urls['dashboard']}/?job={job_id}")
    seen_running = False
    deadline = time.monotonic() + 400
    text = ""
    while time.monotonic() < deadline:
        text = page_text(browser)
        seen_running = seen_running or ("RUNNING" in text or "QUEUED" in text)
        job = svc.registry.get_job(job_id)
        if (job is not None and job.status == "DONE" and "DONE" in text
                and f"\n{job.version}\n" in text):
            break
        time.sleep(1)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard-job-done.png"))
    # Assert: the final version and accuracy as the registry has them, and the model offered
    job = svc.registry.get_job(job_id)
    assert job.status == "DONE"
    assert seen_running, "the page never showed the job before it finished"
    assert "DONE" in text
    assert f"job={job_id}" in browser.current_url  # the grid is drawn on a canvas, not in text
    assert f"\n{job.version}\n" in text, text[:2000]
    accuracy = f"{100 * job.head.holdout_accuracy:.1f}%"
    assert accuracy in text, (accuracy, text[:2000])
    assert "Model" in text  # the tab holding the download buttons
