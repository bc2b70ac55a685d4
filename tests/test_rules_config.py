"""Rule thresholds from YAML and the run's `rules` / `notify` settings: errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

import flightlog
from flightlog.config import ConfigError, build_config
from flightlog.rules.config import load


def test_yaml_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("warmup_steps: 100\non_critical: stop\nloss_spike: {sigmas: 4, jump: 0.8}\nslow_step: false\nstall: {min_seconds: 30}\n")
    config = load(str(path))
    spike = config.detectors["loss_spike"]
    assert (config.warmup_steps, config.on_critical) == (100, "stop")
    assert (spike.sigmas, spike.jump, spike.window) == (4.0, 0.8, 128)  # type: ignore[attr-defined]
    assert config.detectors["slow_step"].enabled is False
    assert config.stall.min_seconds == 30.0 and config.stall.factor == 10.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"loss_spike": {"sigma": 6}}, r"unknown key 'rules\.loss_spike\.sigma'; did you mean 'sigmas'\?"),
        ({"rearm_after": 0}, r"rules\.rearm_after=0 is not allowed; expected an integer >= 1"),
        ({"grad_explosion": {"threshold": "high"}}, r"rules\.grad_explosion\.threshold='high' is not allowed; expected a number"),
        ({"nonfinite": {"severity": "fatal"}}, r"rules\.nonfinite\.severity='fatal' .* one of info, warning, critical"),
        ({"on_critical": "kill"}, r"rules\.on_critical='kill' .* one of continue, stop"),
        ({"los_spike": {}}, r"unknown key 'rules\.los_spike'; did you mean 'loss_spike'\?"),
        ({"plateau": 3}, r"unknown key 'rules\.plateau'"),
        ({"loss_plateau": 3}, r"rules\.loss_plateau=3 .* a mapping of thresholds"),
    ],
)
def test_bad_values_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(data)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read rules file"):
        load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss_spike: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(str(bad))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("rearm_after: -3\n")
    with pytest.raises(ConfigError, match=r"wrong\.yaml: rules\.rearm_after=-3"):
        load(str(wrong))


def test_run_settings(tmp_path: Path) -> None:
    """`rules` accepts true/false/path/mapping (and FLIGHTLOG_RULES=false); anything else names the key."""
    with pytest.raises(ConfigError, match=r"rules=123"):
        build_config(rules=123, env={})
    with pytest.raises(ConfigError, match=r"notify=\[1\]"):
        build_config(notify=[1], env={})
    config = build_config(env={"FLIGHTLOG_RULES": "false", "FLIGHTLOG_NOTIFY": "https://hooks.slack.com/services/T/B/C"})
    assert load(config.rules).enabled is False and config.notify == ["https://hooks.slack.com/services/T/B/C"]
    run = flightlog.init(output_dir=tmp_path, sinks=["jsonl"], install_signal_handlers=False, rules=False)
    try:
        assert run.rules is None and run.should_stop is False
    finally:
        run.finish()
    with pytest.raises(ConfigError, match=r"rules\.loss_spike\.sigma"):
        flightlog.init(output_dir=tmp_path / "b", sinks=["jsonl"], install_signal_handlers=False, rules={"loss_spike": {"sigma": 1}})
