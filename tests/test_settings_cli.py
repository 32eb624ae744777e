"""Settings load from TOML and environment; bad values exit non-zero with one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forestflow.settings import Settings, SettingsError
from tests.support import ROOT


def test_toml_then_env_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "ff.toml"
    config.write_text('port = 9000\n[kafka]\ntopic = "preds"\n')
    settings = Settings.load(config, environ={"FORESTFLOW_PORT": "9100", "FORESTFLOW_ALLOW_PYTHON": "true"})
    assert (settings.port, settings.kafka_topic, settings.allow_python) == (9100, "preds", True)
    assert Settings.load(config, environ={}, overrides={"port": 9200}).port == 9200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FORESTFLOW_PORT": "eighty"}, "invalid port"),
        ({"FORESTFLOW_PORT": "70000"}, "invalid port"),
        ({"FORESTFLOW_HOST": "0.0.0.0"}, "no admin token"),
        ({"FORESTFLOW_KAFKA_ACKS": "2"}, "invalid kafka_acks"),
        ({"FORESTFLOW_NOPE": "1"}, "unknown setting FORESTFLOW_NOPE"),
        ({"FORESTFLOW_KAFKA_INGEST_TOPICS": "requests"}, "kafka_bootstrap_servers to be set too"),
        (
            {"FORESTFLOW_KAFKA_INGEST_TOPICS": "a,b c", "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": "k:9092"},
            "invalid kafka_ingest_topics",
        ),
        ({"FORESTFLOW_KAFKA_REPLY_TOPIC": "no/slash"}, "invalid kafka_reply_topic"),
        ({"FORESTFLOW_MAX_BATCH_WAIT_US": "-5"}, "invalid max_batch_wait_us"),
        ({"FORESTFLOW_MAX_BATCH_WAIT_US": "2000000"}, "invalid max_batch_wait_us"),
    ],
)
def test_bad_settings_raise(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.load(environ=env)


def test_micro_batching_defaults_come_from_the_environment() -> None:
    settings = Settings.load(environ={"FORESTFLOW_MAX_BATCH_WAIT_US": "250", "FORESTFLOW_MAX_BATCH_ROWS": "32"})
    assert (settings.max_batch_wait_us, settings.max_batch_rows) == (250, 32)
    assert Settings.load(environ={}).max_batch_wait_us == 0


def test_kafka_ingest_topics_are_a_comma_separated_list() -> None:
    env = {"FORESTFLOW_KAFKA_INGEST_TOPICS": " a.requests, b-requests ,", "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": "k:9092"}
    assert Settings.load(environ=env).kafka_ingest_topic_list == ("a.requests", "b-requests")
    assert Settings.load(environ={}).kafka_ingest_topic_list == ()


def test_non_loopback_bind_allowed_with_token_or_flag() -> None:
    assert Settings.load(environ={"FORESTFLOW_HOST": "0.0.0.0", "FORESTFLOW_ADMIN_TOKEN": "t"}).host == "0.0.0.0"
    assert Settings.load(environ={"FORESTFLOW_HOST": "0.0.0.0"}, overrides={"insecure_admin": True}).insecure_admin


def test_serve_with_bad_value_exits_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "forestflow.cli", "serve", "--data-dir", str(tmp_path)],
        env={"FORESTFLOW_PORT": "-5", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid port" in lines[0], result.stderr


def test_generated_protobuf_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_jvm_settings_are_settings_with_help(tmp_path: Path) -> None:
    """FORESTFLOW_JVM_OPTS / FORESTFLOW_GENMODEL_JAR (documented in runtime/jvm.py) were "unknown settings"."""
    import dataclasses

    from forestflow.runtime import jvm

    jar = tmp_path / "genmodel.jar"
    jar.write_bytes(b"PK")
    settings = Settings.load(environ={"FORESTFLOW_JVM_OPTS": "-Xmx1g -Dx='a b'", "FORESTFLOW_GENMODEL_JAR": str(jar)})
    assert (settings.jvm_opts, settings.genmodel_jar) == ("-Xmx1g -Dx='a b'", str(jar))
    docs = {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(Settings)}
    assert "JVM" in docs["jvm_opts"] and "genmodel" in docs["genmodel_jar"]
    with pytest.raises(SettingsError, match="invalid genmodel_jar"):
        Settings.load(environ={"FORESTFLOW_GENMODEL_JAR": str(tmp_path / "missing.jar")})
    saved = dict(jvm._configured)
    try:
        jvm.configure(settings.jvm_opts, settings.genmodel_jar)
        assert jvm._jvm_options()[-2:] == ["-Xmx1g", "-Dx=a b"]
        assert jvm.genmodel_jar() == jar
    finally:
        jvm._configured.clear()
        jvm._configured.update(saved)


@pytest.mark.parametrize("command", [["serve", "--port", "-5"], ["logs", "tail"]])
def test_serve_and_logs_tail_accept_jvm_variables(tmp_path: Path, command: list[str]) -> None:
    """Neither command refuses the JVM variables (serve gets as far as the next bad value; the tail
    finds no log); before they were settings, both exited 2 with "unknown setting"."""
    jar = tmp_path / "genmodel.jar"
    jar.write_bytes(b"PK")
    env = {"FORESTFLOW_JVM_OPTS": "-Xmx256m", "FORESTFLOW_GENMODEL_JAR": str(jar), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "forestflow.cli", *command, "--data-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "unknown setting" not in result.stderr, result.stderr
    if command[0] == "serve":
        assert result.returncode == 2 and "invalid port" in result.stderr, result.stderr
    else:
        assert result.returncode == 1 and "no prediction log" in result.stderr, result.stderr
