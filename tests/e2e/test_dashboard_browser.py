"""A person's view: headless Chromium, a laptop's 1280 px wide window, follows a job of many
versions on the dashboard from the start to DONE, and reads the finished job's page: its
learning curve drawn, every headline figure whole, the upload form's defaults true.

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
from bucketlearn.domain.head import attach_head
from bucketlearn.options import default_text
from bucketlearn.views.options_data import form_fields

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
WIDTH, HEIGHT = 1280, 1600  # a laptop
EPOCHS = 25  # digits: 2 tasks an epoch, one at a time: 50 versions


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
                 "--disable-component-update", "--disable-sync",
                 f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def page_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def shown_labels(root: Any, selector: str) -> list[str]:
    """The labels of the elements under ``root`` that match ``selector`` and are drawn (none
    while the page is redrawn under the query)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return [e.get_attribute("aria-label") for e in root.find_elements(By.CSS_SELECTOR, selector)
                if e.is_displayed()]
    except StaleElementReferenceException:
        return []


def wait_for(check: Any, timeout: float, poll: float = 1.0) -> Any:
    """``check()``'s first truthy answer within ``timeout`` seconds (its last answer then)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(poll)


# each headline figure (value and label) and what it holds, with the widths that cut it: an
# element whose text is wider than its box (scrollWidth > clientWidth) shows "81…"
CUT_FIGURES = """
return [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stMetricValue"],'
                                     + '[data-testid="stMain"] [data-testid="stMetricLabel"]')]
  .filter(e => e.innerText.trim() && e.getBoundingClientRect().width > 0)
  .flatMap(e => [e, ...e.querySelectorAll('*')].map(x => [e.innerText.trim(), x.scrollWidth,
                                                          x.clientWidth]))
"""
# the points a chart of the page draws: their accessible names ("version: 50; value: 0.97;
# figure: Holdout accuracy"), and whether a line joins them
CHART_POINTS = """
const chart = document.querySelector('[data-testid="stVegaLiteChart"][aria-label^="' +
                                     arguments[0] + '"]');
if (!chart) return null;
return {points: [...chart.querySelectorAll('g.mark-symbol.role-mark path')]
                  .map(p => p.getAttribute('aria-label')),
        lines: [...chart.querySelectorAll('g.mark-line path')]
                 .filter(p => (p.getAttribute('d') || '').includes('L')).length};
"""


@pytest.fixture(scope="module")
def stack(make_module_stack: Any) -> Any:
    """The local stack with its dashboard, shared by this module's tests."""
    return make_module_stack("dash", workers=2, dashboard=True)


def test_dashboard_follows_a_job_to_done(stack: Any, browser: Any) -> None:
    # Prepare: a job of many versions, one task at a time
    svc = google_services(stack.settings)
    digits = REPO / "data" / "digits.csv"
    info = svc.store.write_file(stack.settings.uploads_bucket, "digits.csv", str(digits),
                                "text/csv", {"epochs": str(EPOCHS)})
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
                and f"\n{shown_version(job)}\n" in text):
            break
        time.sleep(1)
    job = svc.registry.get_job(job_id)
    evaluated = {v.version for v in attach_head(svc.registry.list_versions(job_id), job.head)
                 if v.figure("holdout_accuracy") is not None}
    curve = wait_for(lambda: curve_drawn(browser, evaluated), 60)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard-job-done.png"))
    # Assert: the final version and accuracy as the registry has them, and the model offered
    assert job.status == "DONE"
    assert seen_running, "the page never showed the job before it finished"
    assert "DONE" in text
    assert f"job={job_id}" in browser.current_url  # the grid is drawn on a canvas, not in text
    assert f"\n{shown_version(job)}\n" in text, text[:2000]
    accuracy = f"{100 * job.head.holdout_accuracy:.1f}%"
    assert accuracy in text, (accuracy, text[:2000])
    assert "Model" in text  # the tab holding the download buttons
    # Assert: the learning curve is drawn: a point for each version evaluated (however few a
    # job that trains this fast has) and for the final one, a line through them
    # (the final figures are the exported version's: the best by validation)
    assert job.version >= job.head.version >= 2 and job.head.version in evaluated, (
        job.head.version, evaluated)
    assert curve, (evaluated, browser.execute_script(CHART_POINTS, "Accuracy and macro-F1"))
    assert "No evaluated version yet" not in page_text(browser)
    # Assert: every headline figure is whole at 1280 px
    figures = browser.execute_script(CUT_FIGURES)
    assert {shown for shown, _, _ in figures} >= {accuracy, shown_version(job)}, figures
    assert [f for f in figures if f[1] > f[2]] == [], figures


def shown_version(job: Any) -> str:
    """The headline's version of a DONE job: the exported one, "of" the last where they
    differ (the best by validation came before the last epoch)."""
    if job.head is not None and job.head.version != job.version:
        return f"{job.head.version} of {job.version}"
    return str(job.version)


def curve_drawn(browser: Any, evaluated: set[int]) -> bool:
    """Whether the holdout accuracy chart has a point at each of the ``evaluated`` versions
    (and no other), joined by a line when there are two or more."""
    drawn = browser.execute_script(CHART_POINTS, "Accuracy and macro-F1")
    if not drawn:
        return False
    versions = {int(point.split(";")[0].removeprefix("version: ")) for point in drawn["points"]
                if point and "figure: Holdout accuracy" in point}
    return versions == evaluated and (drawn["lines"] > 0 or len(evaluated) < 2)


def test_the_upload_form_claims_only_true_defaults(stack: Any, browser: Any) -> None:
    """The upload form at 1280 px: label column and epochs up front, the other options under
    "Advanced", each labelled in words; every field's default as shown (a placeholder, or a
    choice's "default (…)") is the option's true default (tasks trained at once: auto)."""
    # Prepare
    from selenium.webdriver.common.by import By

    browser.get(stack.urls["dashboard"])
    sidebar = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR,
                                                     '[data-testid="stSidebar"]'), 60)
    assert sidebar, page_text(browser)[:2000]
    # the fields shown (a closed section's are on the page, not shown), once the page shows any:
    # on a loaded machine the inputs are on the page a moment before they are drawn
    up_front = wait_for(lambda: shown_labels(sidebar[0], "input[placeholder^='default']"), 60)
    # Execute: open "Advanced"
    (advanced,) = [e for e in sidebar[0].find_elements(By.CSS_SELECTOR, "summary")
                   if e.text.strip().endswith("Advanced")]
    advanced.click()
    fields = {f.label: f for f in form_fields()}
    shown = wait_for(lambda: shown_defaults(sidebar[0]) if len(shown_defaults(sidebar[0])) ==
                     len(fields) else None, 30)
    # Assert
    assert up_front == ["Label column", "Epochs"]
    assert shown, shown_defaults(sidebar[0])
    assert shown == {label: f.placeholder if f.choices is None else f"default ({f.default})"
                     for label, f in fields.items()}
    assert shown["Tasks trained at once"] == f"default: {default_text('parallel_tasks')}" == (
        "default: auto")


def shown_defaults(sidebar: Any) -> dict[str, str]:
    """Each option field of the form (by its label): the default it shows."""
    from selenium.webdriver.common.by import By

    found = {}
    for field in sidebar.find_elements(By.CSS_SELECTOR, "input"):
        label = field.get_attribute("aria-label") or ""
        placeholder = field.get_attribute("placeholder") or ""
        if placeholder.startswith("default"):
            found[label] = placeholder
        elif (field.get_attribute("value") or "").startswith("default ("):
            found[label] = field.get_attribute("value")
    return found
