"""bucketlearn dashboard: ``streamlit run dashboard/app.py``.

The entry point: it picks the page's Services, ``bootstrap.process_services`` (Google Cloud, or
the emulators the environment names; made once per process), and hands that factory to the page,
``bucketlearn.entrypoints.dashboard.main``, which Streamlit runs again on every interaction. The
AppTest (tests/integration/test_dashboard_apptest.py) runs the same ``main`` with its own.
"""

from bucketlearn.bootstrap import process_services
from bucketlearn.entrypoints.dashboard import main

main(process_services)
