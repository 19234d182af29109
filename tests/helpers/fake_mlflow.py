"""An in-memory stand-in for ``mlflow.MlflowClient``: the methods the tracker calls, a server
that can be switched off (``down``), and a record of every metric value logged."""

from __future__ import annotations

import re
from collections import defaultdict
from types import SimpleNamespace
from typing import Any


class FakeClient:
    def __init__(self) -> None:
        self.down = False
        self.calls = 0
        self.experiments: dict[str, str] = {}
        self.experiment_tags: dict[str, dict[str, str]] = defaultdict(dict)
        self.runs: dict[str, dict[str, Any]] = {}
        self.logged: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
        self.artifacts: dict[str, list[tuple[str, str | None]]] = defaultdict(list)

    def _answer(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")

    def get_experiment_by_name(self, name: str) -> Any:
        self._answer()
        eid = self.experiments.get(name)
        if eid is None:
            return None
        tags = dict(self.experiment_tags[eid])
        return SimpleNamespace(experiment_id=eid, lifecycle_stage="active", tags=tags)

    def create_experiment(self, name: str, tags: dict[str, str] | None = None) -> str:
        self._answer()
        self.experiments[name] = str(len(self.experiments) + 1)
        self.experiment_tags[self.experiments[name]] = dict(tags or {})
        return self.experiments[name]

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        self._answer()
        self.experiment_tags[experiment_id][key] = value

    def create_run(self, experiment_id: str, *, run_name: str, tags: dict[str, str]) -> Any:
        self._answer()
        rid = f"r{len(self.runs) + 1}"
        self.runs[rid] = {
            "experiment": experiment_id,
            "name": run_name,
            "tags": dict(tags),
            "params": {},
            "status": "RUNNING",
            "order": len(self.runs),
        }
        return SimpleNamespace(info=SimpleNamespace(run_id=rid))

    def search_runs(
        self,
        experiment_ids: list[str],
        *,
        filter_string: str,
        max_results: int | None = None,
        order_by: list[str] | None = None,
    ) -> list[Any]:
        self._answer()
        wanted = dict(re.findall(r"tags\.`([^`]+)` = '([^']*)'", filter_string))
        status = re.findall(r"attributes\.status = '([^']*)'", filter_string)
        found = [
            SimpleNamespace(
                info=SimpleNamespace(run_id=rid, run_name=run["name"], status=run["status"])
            )
            for rid, run in sorted(self.runs.items(), key=lambda kv: kv[1]["order"])
            if run["experiment"] in experiment_ids
            and all(run["tags"].get(k) == v for k, v in wanted.items())
            and all(run["status"] == s for s in status)
        ]
        return found[:max_results] if max_results else found

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self._answer()
        run = self.runs[run_id]
        for m in metrics:
            self.logged[run_id].append((m.key, m.step, m.value))
        for p in params:
            assert run["params"].get(p.key, p.value) == p.value, "a param changed"
            run["params"][p.key] = p.value
        for t in tags:
            run["tags"][t.key] = t.value

    def update_run(self, run_id: str, status: str | None = None) -> None:
        self._answer()
        if status:
            self.runs[run_id]["status"] = status

    def set_terminated(self, run_id: str, status: str | None = None) -> None:
        self._answer()
        self.runs[run_id]["status"] = status or "FINISHED"

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        self._answer()
        return [SimpleNamespace(step=s) for k, s, _ in self.logged[run_id] if k == key]

    def delete_run(self, run_id: str) -> None:
        self._answer()
        del self.runs[run_id]

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self._answer()
        self.artifacts[run_id].append((local_path, artifact_path))

    # --- what the tests read ----------------------------------------------------------------
    def child_runs(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.runs.items() if "mlflow.parentRunId" in v["tags"]}

    def steps(self, run_id: str, key: str) -> list[int]:
        return [s for k, s, _ in self.logged[run_id] if k == key]
