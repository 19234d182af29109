"""What the Prefect tasks and flows share and are not tasks themselves: the GPU lock and its
holder records, the notification events, the UI's live views of a training, and the options
and records every phase task uses. Installed as ``gpucampaign_prefect.orchestration``, like
``tasks`` and ``flows``."""
