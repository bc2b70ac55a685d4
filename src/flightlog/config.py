"""One validated configuration object, built from keyword arguments, a YAML file and
``FLIGHTLOG_*`` environment variables.

Precedence, lowest first: defaults < YAML file < environment < keyword arguments.
A bad value fails at ``init`` with a :class:`ConfigError` that names the key, where the
value came from and what is allowed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from flightlog.protocol import LEVELS

ENV_PREFIX = "FLIGHTLOG_"
# FLIGHTLOG_* variables read by other parts of flightlog, not config keys.
RESERVED_ENV = frozenset({"FLIGHTLOG_HOME", "FLIGHTLOG_CONFIG", "FLIGHTLOG_TOKEN"})

FSYNC_POLICIES = ("never", "flush", "finish")
FULL_POLICIES = ("block", "drop_oldest")
CONSOLE_STREAMS = ("stdout", "stderr")
DIST_MODES = ("reduce", "figures", "off")
DIST_REDUCE_OPS = ("mean", "sum", "max", "min", "rank0")
DIST_ON_FAILURE = ("raise", "continue")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


@dataclass(kw_only=True)
class Config:
    """Everything a run can be told. Each field is a key in kwargs, YAML and env."""

    output_dir: str = "output"
    """The trainer's output directory; logs go to ``OUTPUT_DIR/logs`` unless ``log_dir`` says otherwise."""
    log_dir: str | None = None
    """Where ``train.jsonl`` and ``run.json`` go (default ``OUTPUT_DIR/logs``)."""
    run_name: str | None = None
    """Human name of the run (default: the output directory's name)."""
    run_id: str | None = None
    """Stable id; default: the id found in the log directory, else a new time-ordered id."""
    task_type: str | None = None
    """sft, dpo, ppo, kto, pretrain, embedding, reranker, moe, ... (free text)."""
    model_name: str | None = None
    dataset: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    """The run's hyper-parameters, recorded in ``run_start`` and ``run.json``."""
    logging_steps: int = 1
    """Write a metrics record only every N steps (events are always written)."""
    max_logging_steps_per_epoch: int | None = None
    """At most this many metrics records per epoch (spread evenly when ``steps_per_epoch`` is known)."""
    steps_per_epoch: int | None = None
    max_steps: int | None = None
    """Total optimizer steps, shown as ``Step 45/500`` on the console."""
    resumed_from_step: int | None = None
    """This process continues the run from a checkpoint at this step; later records of earlier segments are superseded."""
    sinks: list[Any] = field(default_factory=lambda: ["jsonl", "console"])
    """Sink names (jsonl, console, csv, ...) or sink objects."""
    log_level: str = "INFO"
    """Events below this level are not recorded."""
    flush_interval: float = 1.0
    """Seconds between flushes; a record is on disk at most this long after ``log``."""
    fsync: str = "finish"
    """never: leave it to the OS; flush: fsync at every flush; finish: fsync when the run ends."""
    queue_size: int = 100_000
    """Records the queue holds before ``on_full`` applies."""
    on_full: str = "block"
    """block: the caller waits (with one warning); drop_oldest: oldest records are dropped and counted."""
    compress: bool = False
    """Write the stream as gzip segments ``train.NNNNN.jsonl.gz``."""
    segment_bytes: int = 64 * 1024 * 1024
    """Rotate a gzip segment when its compressed size passes this."""
    columnar: bool = True
    """Also keep an Arrow copy of ``train.jsonl`` in ``logs/train.cols/`` (off the hot path) so ``flightlog.load`` parses no JSON; plain streams only."""
    csv_compress: bool = False
    """Write the CSV sink's file as ``metrics.csv.gz``."""
    redact: bool = True
    """Mask API keys, tokens and passwords in everything written."""
    redact_drop: list[str] = field(default_factory=list)
    """Field names whose values are removed (e.g. prompt)."""
    redact_hash: list[str] = field(default_factory=list)
    """Field names whose values are replaced by a stable hash (e.g. file paths)."""
    heartbeat_interval: float = 10.0
    """Seconds between heartbeats in ``run.json``; a run silent for 3x this is taken as crashed."""
    console_stream: str = "stdout"
    install_signal_handlers: bool = True
    """Flush and mark the run on SIGTERM/SIGINT (main thread only)."""
    rules: Any = True
    """Diagnosis rules: true (defaults), false, a path to a rules YAML file, or a mapping (docs/rules.md)."""
    notify: list[Any] = field(default_factory=list)
    """Where alerts go: URLs or mappings (Slack, DingTalk, Feishu, Alertmanager, webhook; docs/rules.md)."""
    # --- optional sinks (docs/sinks.md)
    tensorboard_dir: str | None = None
    """Where the tensorboard sink writes event files (default ``LOG_DIR/tensorboard``)."""
    histogram_interval: int = 100
    """Steps between weight histograms (``flightlog.sinks.histograms.log_lora_histograms``)."""
    prometheus_host: str = "127.0.0.1"
    """Address the prometheus sink's ``/metrics`` binds; anything but loopback needs a token."""
    prometheus_port: int = 9464
    """Port of the prometheus sink's ``/metrics``; 0 picks a free one."""
    prometheus_token: str | None = None
    """Bearer token scrapers must send (default: ``FLIGHTLOG_TOKEN``); required off loopback."""
    wandb_project: str | None = None
    """W&B project of the wandb sink (default: ``WANDB_PROJECT``, else ``flightlog``)."""
    mlflow_tracking_uri: str | None = None
    """MLflow store of the mlflow sink (default: ``MLFLOW_TRACKING_URI``, else ``sqlite:///LOG_DIR/mlflow.db``)."""
    mlflow_experiment: str | None = None
    """MLflow experiment (default: ``MLFLOW_EXPERIMENT_NAME``, else ``flightlog``)."""
    dist_mode: str = "reduce"
    """Under torch.distributed: reduce (metrics reduced across ranks + per-rank figures), figures (rank 0's
    values as they are, e.g. already reduced by the trainer, + per-rank figures), off (no collectives)."""
    dist_policy: dict[str, str] = field(default_factory=dict)
    """Metric name or glob -> mean, sum, max, min or rank0; defaults: *memory* max, throughput_* sum, others mean."""
    dist_weight: str | None = None
    """A metric holding each rank's sample or token count: means are weighted by it (it is summed)."""
    dist_timeout: float = 600.0
    """Seconds flightlog's collectives wait for the other ranks before naming the rank that stopped answering."""
    dist_on_failure: str = "raise"
    """After a failed collective: raise (log() raises DistributedTimeout) or continue (rank-local values)."""
    rank_streams: bool = False
    """Every rank also writes its own, unreduced records to ``rank-N.jsonl`` (rank, host, node address)."""
    straggler_margin: float = 0.2
    """A rank slower than the others' median step time by more than this fraction is lagging."""
    straggler_patience: int = 3
    """Logging steps in a row the same rank must lag before a straggler alert."""
    index: bool = True
    """Keep the run in the run index under FLIGHTLOG_HOME (``flightlog ls``); never fatal to training."""

    def __post_init__(self) -> None:
        validate(self, {})

    @property
    def resolved_log_dir(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.output_dir) / "logs"

    @property
    def level_number(self) -> int:
        return (LEVELS.index(self.log_level) + 1) * 10


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}


def _positive_int(v: Any) -> bool:
    return type(v) is int and v >= 1


def _optional(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _positive_number(v: Any) -> bool:
    return type(v) in (int, float) and v > 0 and v == v and v != float("inf")


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _choice(*allowed: str) -> Any:
    return lambda v: v in allowed


def _sinks(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) or hasattr(x, "write") for x in v)


# key -> (check, description of what is allowed)
RULES: dict[str, tuple[Any, str]] = {
    "output_dir": (lambda v: isinstance(v, (str, os.PathLike)) and str(v) != "", "a non-empty path"),
    "log_dir": (_optional(lambda v: isinstance(v, (str, os.PathLike))), "a path"),
    "run_name": (_optional(lambda v: isinstance(v, str) and v != ""), "a non-empty string"),
    "run_id": (
        _optional(lambda v: isinstance(v, str) and v != "" and all(c.isalnum() or c in "-_." for c in v)),
        "letters, digits, '-', '_' and '.'",
    ),
    "task_type": (_optional(lambda v: isinstance(v, str)), "a string such as sft, dpo, ppo, embedding, moe"),
    "model_name": (_optional(lambda v: isinstance(v, str)), "a string"),
    "dataset": (_optional(lambda v: isinstance(v, str)), "a string"),
    "config": (lambda v: isinstance(v, Mapping), "a mapping of hyper-parameters"),
    "logging_steps": (_positive_int, "an integer >= 1"),
    "max_logging_steps_per_epoch": (_optional(_positive_int), "an integer >= 1 or null"),
    "steps_per_epoch": (_optional(_positive_int), "an integer >= 1 or null"),
    "max_steps": (_optional(_positive_int), "an integer >= 1 or null"),
    "resumed_from_step": (_optional(lambda v: type(v) is int and v >= 0), "an integer >= 0 or null"),
    "sinks": (_sinks, "a list of sink names (jsonl, console, csv, ...) or sink objects"),
    "log_level": (_choice(*LEVELS), "one of " + ", ".join(LEVELS)),
    "flush_interval": (lambda v: _positive_number(v) and v <= 60, "a number of seconds > 0 and <= 60"),
    "fsync": (_choice(*FSYNC_POLICIES), "one of " + ", ".join(FSYNC_POLICIES)),
    "queue_size": (_positive_int, "an integer >= 1"),
    "on_full": (_choice(*FULL_POLICIES), "one of " + ", ".join(FULL_POLICIES)),
    "compress": (lambda v: type(v) is bool, "true or false"),
    "columnar": (lambda v: type(v) is bool, "true or false"),
    "segment_bytes": (lambda v: type(v) is int and v >= 4096, "an integer >= 4096"),
    "csv_compress": (lambda v: type(v) is bool, "true or false"),
    "redact": (lambda v: type(v) is bool, "true or false"),
    "redact_drop": (_str_list, "a list of field names"),
    "redact_hash": (_str_list, "a list of field names"),
    "heartbeat_interval": (_positive_number, "a number of seconds > 0"),
    "console_stream": (_choice(*CONSOLE_STREAMS), "one of " + ", ".join(CONSOLE_STREAMS)),
    "install_signal_handlers": (lambda v: type(v) is bool, "true or false"),
    "rules": (lambda v: isinstance(v, (bool, str, os.PathLike, Mapping)), "true, false, a path to a rules YAML file or a mapping"),
    "notify": (lambda v: isinstance(v, list) and all(isinstance(x, (str, Mapping)) for x in v), "a list of URLs or mappings with 'url'"),
    "tensorboard_dir": (_optional(lambda v: isinstance(v, (str, os.PathLike)) and str(v) != ""), "a non-empty path or null"),
    "histogram_interval": (_positive_int, "an integer >= 1"),
    "prometheus_host": (lambda v: isinstance(v, str) and v != "" and not any(c.isspace() for c in v), "a host name or IP address"),
    "prometheus_port": (lambda v: type(v) is int and 0 <= v <= 65535, "an integer port 0..65535 (0 = any free port)"),
    "prometheus_token": (_optional(lambda v: isinstance(v, str) and len(v) >= 8), "a string of at least 8 characters, or null"),
    "wandb_project": (_optional(lambda v: isinstance(v, str) and v != ""), "a non-empty string or null"),
    "mlflow_tracking_uri": (_optional(lambda v: isinstance(v, str) and v != ""), "a non-empty URI or null"),
    "mlflow_experiment": (_optional(lambda v: isinstance(v, str) and v != ""), "a non-empty string or null"),
    "dist_mode": (_choice(*DIST_MODES), "one of " + ", ".join(DIST_MODES)),
    "dist_policy": (
        lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and k and p in DIST_REDUCE_OPS for k, p in v.items()),
        "a mapping of metric name or glob to one of " + ", ".join(DIST_REDUCE_OPS),
    ),
    "dist_weight": (_optional(lambda v: isinstance(v, str) and v != ""), "a metric name or null"),
    "dist_timeout": (_positive_number, "a number of seconds > 0"),
    "dist_on_failure": (_choice(*DIST_ON_FAILURE), "one of " + ", ".join(DIST_ON_FAILURE)),
    "rank_streams": (lambda v: type(v) is bool, "true or false"),
    "straggler_margin": (_positive_number, "a fraction > 0 (0.2 = 20% slower)"),
    "straggler_patience": (_positive_int, "an integer >= 1"),
    "index": (lambda v: type(v) is bool, "true or false"),
}
assert set(RULES) == set(FIELDS), "every config field needs a validation rule"


def validate(config: Config, sources: Mapping[str, str]) -> None:
    """Raise ConfigError for the first field whose value is not allowed."""
    for key, (check, allowed) in RULES.items():
        value = getattr(config, key)
        if not check(value):
            where = f" (from {sources[key]})" if key in sources else ""
            shown = "<hidden>" if key.endswith("_token") and isinstance(value, str) else repr(value)  # never echo a secret
            raise ConfigError(f"flightlog config: {key}={shown}{where} is not allowed; expected {allowed}")


def _unknown_key(key: str, source: str) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(key, FIELDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"flightlog config: unknown key {key!r} (from {source}){hint} Known keys: {', '.join(FIELDS)}"
    )


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_env(key: str, text: str, env_name: str) -> Any:
    """Turn an environment string into the field's type; errors name the variable."""
    kind = str(FIELDS[key].type)
    try:
        if kind.startswith("bool"):
            low = text.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ValueError
            return low in _TRUE
        if kind.startswith("int") or kind.startswith("int |"):
            return None if text.strip().lower() in ("", "none", "null") else int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("list"):
            return [part.strip() for part in text.split(",") if part.strip()]
        if kind.startswith("dict"):
            import json

            return json.loads(text)
        if kind.startswith("str | None"):
            return text or None
        return text
    except ValueError:
        allowed = RULES[key][1]
        raise ConfigError(
            f"flightlog config: {key}={text!r} (from {env_name}) is not allowed; expected {allowed}"
        ) from None


def load_yaml_mapping(path: str | os.PathLike[str], what: str, section: str | None = None) -> dict[str, Any]:
    """A YAML file's mapping (its ``section`` key when present); errors name ``what`` and the path."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"flightlog config: cannot read {what} {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"flightlog config: {what} {str(path)!r} is not valid YAML: {exc}") from None
    if section and isinstance(data, dict) and isinstance(data.get(section), dict):
        data = data[section]
    if not isinstance(data, dict):
        raise ConfigError(f"flightlog config: {what} {str(path)!r} must hold a mapping of keys")
    return data


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The flightlog section of a YAML file (a top-level ``flightlog:`` key, or the whole file)."""
    data = load_yaml_mapping(path, "config_file", section="flightlog")
    return data


def build_config(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Config:
    """Merge defaults, YAML, environment and keyword arguments into one validated Config."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    config_file = config_file or env.get("FLIGHTLOG_CONFIG")
    if config_file:
        for key, value in read_yaml(config_file).items():
            if key not in FIELDS:
                raise _unknown_key(str(key), f"config_file {str(config_file)!r}")
            values[key], sources[key] = value, f"config_file {str(config_file)!r}"

    for env_name, text in env.items():
        if not env_name.startswith(ENV_PREFIX) or env_name in RESERVED_ENV:
            continue
        key = env_name[len(ENV_PREFIX):].lower()
        if key not in FIELDS:
            raise _unknown_key(key, f"environment variable {env_name}")
        values[key], sources[key] = _parse_env(key, text, env_name), env_name

    for key, value in kwargs.items():
        if key not in FIELDS:
            raise _unknown_key(key, "keyword arguments")
        if value is not None or key not in values:
            values[key], sources[key] = value, "keyword arguments"

    for key in ("output_dir", "log_dir"):
        if isinstance(values.get(key), os.PathLike):
            values[key] = os.fspath(values[key])
    if isinstance(values.get("config"), Mapping):
        values["config"] = dict(values["config"])
    if isinstance(values.get("sinks"), tuple):
        values["sinks"] = list(values["sinks"])

    config = Config.__new__(Config)
    for name, fld in FIELDS.items():
        if name in values:
            setattr(config, name, values[name])
        elif fld.default_factory is not dataclasses.MISSING:
            setattr(config, name, fld.default_factory())
        else:
            setattr(config, name, fld.default)
    validate(config, sources)
    return config
