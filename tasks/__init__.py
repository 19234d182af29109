"""Thin Prefect tasks, one module per campaign phase. Not installed: imported from the repo root."""
