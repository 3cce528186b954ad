"""``python -m tuner.pretrain --suite`` trains on a suite's twins beside the random ones, and
refuses a held-out suite, which pretraining must never see."""

import pytest

from tuner import pretrain as pretrain_module
from tuner.scenario import load_suite


def test_pretraining_runs_the_suites_twins(monkeypatch):
    suite = load_suite("tuner/suites/model_wrong.json")[:2]
    seen = []
    real = pretrain_module.PipelineTwin

    def recording(scenario, *args, **kwargs):
        seen.append(scenario.name)
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(pretrain_module, "PipelineTwin", recording)
    _, summary = pretrain_module.pretrain(
        40, episode_steps=10, progress=False, suite=suite, suite_fraction=1.0
    )
    assert summary["suite_scenarios"] == [s.name for s in suite]
    assert set(seen) <= {s.name for s in suite} and seen  # every episode drew from the suite


def test_a_held_out_suite_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        pretrain_module.main(
            ["--out", str(tmp_path / "p.pt"), "--suite", "tuner/suites/model_wrong_holdout.json"]
        )
    assert exit_.value.code == 2
    assert "held-out suite" in capsys.readouterr().err
    assert not (tmp_path / "p.pt").exists()
