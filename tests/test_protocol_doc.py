"""Every jq example in docs/protocol.md runs on a real run and prints something."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT, have_jq

EXAMPLES = re.findall(r"```jq-example\n(.*?)\n```", (ROOT / "docs" / "protocol.md").read_text(), re.S)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    import flightlog

    out = tmp_path_factory.mktemp("doc")
    run = flightlog.init(output_dir=out, sinks=["jsonl"], install_signal_handlers=False, config={"learning_rate": 1e-4, "lora_rank": 64})
    for step in range(1, 21):
        run.log({"loss": 2.0 / step, "learning_rate": 1e-4, "grad_norm": float("nan") if step == 7 else 1.0}, step=step)
        if step % 10 == 0:
            run.log({"eval_loss": 3.0 / step}, step=step)
    run.event("loss is noisy", level="WARNING")
    run.finish()
    return run.log_dir


def test_examples_found():
    """The doc has the examples this test runs."""
    assert len(EXAMPLES) >= 6


@pytest.mark.skipif(not have_jq(), reason="jq is not installed (scripts/system-deps installs it)")
@pytest.mark.parametrize("command", EXAMPLES)
def test_jq_example_runs(command, run_dir):
    """The command exits 0 and prints output."""
    out = subprocess.run(["bash", "-c", command], cwd=run_dir, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
