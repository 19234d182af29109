"""Invalid input, by whose it is: one paragraph that names what is wrong and the fix (the CLI
exits 2, with no traceback).

``InputError`` is the base every command catches; ``SpecError`` is the campaign spec's fault
(a field of it). The others say the fault is not the spec's: ``ArgumentError`` a
command's or a call's argument (``--out``, ``--input``, ``stop_after_steps``), ``FolderError``
an output folder or a model folder given to a command, ``SettingError`` an environment setting
(``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

from gpucampaign.core.text import redact_secrets


class InputError(ValueError):
    """Invalid user input: one paragraph that names the field and the fix (CLI exit 2).

    Attributes:
        field: What is wrong: a spec field, an argument, a folder, a setting.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(redact_secrets(message))  # never a URL's password
        self.field = field


class SpecError(InputError):
    """The campaign spec is invalid: the field and the fix."""


class ArgumentError(InputError):
    """A command's or a call's argument is invalid (not the spec's fault)."""


class FolderError(InputError):
    """An output folder (or a model folder) given to a command cannot be used as it is."""


class SettingError(InputError):
    """An environment setting is invalid (``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``)."""


#: Every kind by its name (a data-parallel rank's outcome names it; the launcher raises it).
INPUT_ERRORS: dict[str, type[InputError]] = {
    c.__name__: c for c in (InputError, SpecError, ArgumentError, FolderError, SettingError)
}
