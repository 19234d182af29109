"""The file names of a run folder (``OUT/runs/<run_id>/``)."""

PARAMS_FILE = "params.json"
METRICS_FILE = "metrics.jsonl"
MODEL_DIR = "model"
