"""Child process of the data-parallel fault tests: train the control run of ``BASE/spec.json``
(a ``gpus: 2`` run) in the campaign layout ``BASE/out/{checkpoints, runs/<run_id>}``.

Exit codes: 0 done, 130/143 interrupted (SIGINT/SIGTERM), 3 a rank failed, 4 a stop rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucampaign.config import parse_spec
from gpucampaign.core.interrupt import Interrupted, graceful_signals
from gpucampaign.core.stoprules import StopRule
from gpucampaign.data.corpus import load_corpus
from gpucampaign.engine.launch import RankFailed
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore


def main(base: Path) -> int:
    spec = parse_spec(json.loads((base / "spec.json").read_text()))
    assert spec.corpus is not None
    run = spec.resolve_run("control")
    with graceful_signals():
        try:
            train_run(
                spec,
                run=run,
                corpus=load_corpus(base / spec.corpus.path, corpus_spec=spec.corpus),
                store=LocalStore(base / "out" / "checkpoints"),
                run_folder=RunFolder.of(base / "out", run.run_id),
            )
        except Interrupted as exc:
            print(json.dumps({"interrupted": exc.reason, "step": exc.step}), flush=True)
            return exc.exit_code
        except RankFailed as exc:
            print(json.dumps({"rank_failed": str(exc)[:400]}), flush=True)
            return 3
        except StopRule as exc:
            print(json.dumps({"stop": exc.rule}), flush=True)
            return 4
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
