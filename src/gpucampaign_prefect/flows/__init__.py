"""The flows ``campaign`` and ``restart-verification``, installed as
``gpucampaign_prefect.flows``."""
