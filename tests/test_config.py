"""Config: kwargs, YAML and FLIGHTLOG_* env merged and validated; every error names the key."""

from __future__ import annotations

import pytest

from flightlog.config import RULES, Config, ConfigError, build_config


def build(env=None, **kwargs):
    return build_config(env=env or {}, **kwargs)


class TestSources:
    def test_defaults(self):
        """Without any source the documented defaults apply."""
        config = build()
        assert config.logging_steps == 1 and config.flush_interval == 1.0 and config.sinks == ["jsonl", "console"]
        assert str(config.resolved_log_dir) == "output/logs"

    def test_precedence_yaml_env_kwargs(self, tmp_path):
        """defaults < YAML < environment < keyword arguments."""
        path = tmp_path / "fl.yaml"
        path.write_text("flightlog:\n  logging_steps: 5\n  log_level: DEBUG\n  run_name: from-yaml\n")
        env = {"FLIGHTLOG_LOGGING_STEPS": "7", "FLIGHTLOG_LOG_LEVEL": "WARNING"}
        config = build_config(config_file=path, env=env, logging_steps=9)
        assert config.logging_steps == 9
        assert config.log_level == "WARNING"
        assert config.run_name == "from-yaml"

    def test_yaml_without_section_and_via_env(self, tmp_path):
        """A flat YAML file works, found through FLIGHTLOG_CONFIG."""
        path = tmp_path / "flat.yaml"
        path.write_text("max_steps: 500\nsinks: [jsonl, csv]\n")
        config = build(env={"FLIGHTLOG_CONFIG": str(path)})
        assert config.max_steps == 500 and config.sinks == ["jsonl", "csv"]

    def test_env_types(self):
        """Environment strings become the field's type."""
        config = build(
            env={"FLIGHTLOG_COMPRESS": "yes", "FLIGHTLOG_FLUSH_INTERVAL": "0.5", "FLIGHTLOG_SINKS": "jsonl, csv", "FLIGHTLOG_MAX_STEPS": "none"}
        )
        assert config.compress is True and config.flush_interval == 0.5 and config.sinks == ["jsonl", "csv"]
        assert config.max_steps is None

    def test_reserved_env_ignored(self):
        """Variables used by other parts (FLIGHTLOG_HOME) are not config keys."""
        assert build(env={"FLIGHTLOG_HOME": "/tmp/x"}).logging_steps == 1

    def test_kwarg_none_keeps_lower_source(self):
        """Passing None for a key leaves the YAML/env value in place."""
        assert build(env={"FLIGHTLOG_RUN_NAME": "env-name"}, run_name=None).run_name == "env-name"

    def test_dataclass_validates_too(self):
        """Config(...) built directly is validated the same way."""
        with pytest.raises(ConfigError, match="logging_steps"):
            Config(logging_steps=0)


BAD_VALUES = [
    ("logging_steps", 0, "an integer >= 1"),
    ("logging_steps", 2.5, "an integer >= 1"),
    ("max_logging_steps_per_epoch", -1, "an integer >= 1 or null"),
    ("steps_per_epoch", 0, "an integer >= 1 or null"),
    ("max_steps", "500", "an integer >= 1 or null"),
    ("resumed_from_step", -3, "an integer >= 0 or null"),
    ("log_level", "VERBOSE", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("flush_interval", 0, "a number of seconds > 0 and <= 60"),
    ("flush_interval", 120, "a number of seconds > 0 and <= 60"),
    ("fsync", "sometimes", "one of never, flush, finish"),
    ("queue_size", 0, "an integer >= 1"),
    ("on_full", "drop_newest", "one of block, drop_oldest"),
    ("compress", "yes", "true or false"),
    ("columnar", 1, "true or false"),
    ("segment_bytes", 100, "an integer >= 4096"),
    ("csv_compress", 1, "true or false"),
    ("redact", None, "true or false"),
    ("redact_drop", "prompt", "a list of field names"),
    ("redact_hash", [1], "a list of field names"),
    ("heartbeat_interval", -1, "a number of seconds > 0"),
    ("console_stream", "tty", "one of stdout, stderr"),
    ("install_signal_handlers", "no", "true or false"),
    ("sinks", "jsonl", "a list of sink names"),
    ("sinks", [42], "a list of sink names"),
    ("config", [1, 2], "a mapping of hyper-parameters"),
    ("run_id", "has space", "letters, digits"),
    ("run_name", "", "a non-empty string"),
    ("output_dir", "", "a non-empty path"),
    ("task_type", 3, "a string"),
    ("model_name", 3, "a string"),
    ("dataset", 3, "a string"),
    ("log_dir", 3, "a path"),
    ("rules", 3, "true, false, a path to a rules YAML file or a mapping"),
    ("notify", "https://hooks.slack.com/x", "a list of URLs or mappings"),
    # optional sinks (tests/test_sinks_prometheus.py covers more)
    ("tensorboard_dir", "", "a non-empty path or null"),
    ("histogram_interval", 0, "an integer >= 1"),
    ("prometheus_host", "", "a host name or IP address"),
    ("prometheus_port", 70000, "an integer port 0..65535"),
    ("prometheus_token", 12345678, "a string of at least 8 characters"),
    ("wandb_project", "", "a non-empty string or null"),
    ("mlflow_tracking_uri", "", "a non-empty URI or null"),
    ("mlflow_experiment", 3, "a non-empty string or null"),
    ("dist_mode", "all", "one of reduce, figures, off"),
    ("dist_policy", {"loss": "avg"}, "a mapping of metric name or glob to one of mean, sum, max, min, rank0"),
    ("dist_weight", "", "a metric name or null"),
    ("dist_timeout", 0, "a number of seconds > 0"),
    ("dist_on_failure", "ignore", "one of raise, continue"),
    ("rank_streams", "yes", "true or false"),
    ("straggler_margin", -0.1, "a fraction > 0"),
    ("straggler_patience", 0, "an integer >= 1"),
    # run index (tests/test_index.py covers more)
    ("index", "yes", "true or false"),
]


class TestErrors:
    @pytest.mark.parametrize("key,value,allowed", BAD_VALUES, ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
    def test_bad_value_names_key_and_allowed(self, key, value, allowed):
        """Each bad value fails with the key, the value, its source and what is allowed."""
        with pytest.raises(ConfigError) as info:
            build(**{key: value})
        message = str(info.value)
        assert f"{key}={value!r}" in message and "(from keyword arguments)" in message and allowed in message

    def test_every_key_has_a_bad_value_test(self):
        """The table above covers every config key that can be wrong."""
        covered = {k for k, _, _ in BAD_VALUES}
        assert set(RULES) - covered == set()

    def test_unknown_kwarg_suggests(self):
        """A misspelt key is named with a suggestion."""
        with pytest.raises(ConfigError, match=r"unknown key 'loging_steps' \(from keyword arguments\); did you mean 'logging_steps'"):
            build(loging_steps=5)

    def test_unknown_env(self):
        """A misspelt FLIGHTLOG_ variable is an error naming the variable."""
        with pytest.raises(ConfigError, match="environment variable FLIGHTLOG_LOGING_STEPS"):
            build(env={"FLIGHTLOG_LOGING_STEPS": "5"})

    def test_env_parse_error_names_variable(self):
        """An env value of the wrong type names the variable and the allowed values."""
        with pytest.raises(ConfigError, match=r"logging_steps='ten' \(from FLIGHTLOG_LOGGING_STEPS\).*an integer >= 1"):
            build(env={"FLIGHTLOG_LOGGING_STEPS": "ten"})
        with pytest.raises(ConfigError, match=r"compress='maybe' \(from FLIGHTLOG_COMPRESS\)"):
            build(env={"FLIGHTLOG_COMPRESS": "maybe"})

    def test_env_range_error_names_variable(self):
        """A well-typed but out-of-range env value names the variable."""
        with pytest.raises(ConfigError, match=r"log_level='LOUD' \(from FLIGHTLOG_LOG_LEVEL\)"):
            build(env={"FLIGHTLOG_LOG_LEVEL": "LOUD"})

    def test_yaml_errors(self, tmp_path):
        """Unknown keys, bad YAML, a missing file and a non-mapping all name the file."""
        bad_key = tmp_path / "a.yaml"
        bad_key.write_text("logging_step: 3\n")
        with pytest.raises(ConfigError, match=r"unknown key 'logging_step' \(from config_file '.*a.yaml'\)"):
            build_config(config_file=bad_key, env={})
        broken = tmp_path / "b.yaml"
        broken.write_text("logging_steps: [1\n")
        with pytest.raises(ConfigError, match="is not valid YAML"):
            build_config(config_file=broken, env={})
        with pytest.raises(ConfigError, match="cannot read config_file"):
            build_config(config_file=tmp_path / "missing.yaml", env={})
        scalar = tmp_path / "c.yaml"
        scalar.write_text("3\n")
        with pytest.raises(ConfigError, match="must hold a mapping"):
            build_config(config_file=scalar, env={})
        wrong = tmp_path / "d.yaml"
        wrong.write_text("fsync: always\n")
        with pytest.raises(ConfigError, match=r"fsync='always' \(from config_file '.*d.yaml'\)"):
            build_config(config_file=wrong, env={})

    def test_init_fails_before_touching_disk(self, tmp_path):
        """flightlog.init with a bad value raises and creates no log directory."""
        import flightlog

        with pytest.raises(ConfigError, match="logging_steps"):
            flightlog.init(output_dir=tmp_path / "o", logging_steps=-1)
        assert not (tmp_path / "o").exists()
