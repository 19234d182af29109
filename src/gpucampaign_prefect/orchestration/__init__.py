"""What the Prefect tasks and flows share and are not tasks themselves: the GPU lock and its
holder records, the campaign lock, the embedded server of ``campaign run``, the notification
events, the UI's live views of a training, and the options and records every phase task uses.
The layer's lowest rank: it imports neither ``tasks`` nor ``flows``."""
