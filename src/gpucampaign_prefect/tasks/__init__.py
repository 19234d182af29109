"""Thin Prefect tasks, one module per campaign phase; installed as ``gpucampaign_prefect.tasks``."""
