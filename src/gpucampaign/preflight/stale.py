"""A stale copy never writes over a sealed campaign: the store's manifest read before anything
is written.

With an ``s3://`` store a campaign may run on any host, each with its own output folder. A host
revived after another host closed the campaign for good still holds an older folder (cut
mid-training, or never started); were it to go on, its close would seal that older state and
its mirror would send it over the sealed folder in the store, and ``campaign retrieve`` would
return it. So a run reads the store's ``manifest.json`` first, under the campaign lock: when it
seals the campaign for good and is not the folder's own manifest, the run is refused before
anything is written here or in the store. Otherwise the manifest it found is its ``Fence``: its
close mirrors only while the store still holds that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpucampaign.config import CampaignSpec
from gpucampaign.core.errors import FolderError, SettingError
from gpucampaign.core.files import sha256_bytes, sha256_file
from gpucampaign.core.storageurl import is_s3
from gpucampaign.folder.layout import MANIFEST
from gpucampaign.preflight.ownership import sealed_for_good
from gpucampaign.storage.base import NotFound, StorageError
from gpucampaign.storage.mirror import Fence
from gpucampaign.storage.open import open_store, read_wait_s


def fence_sealed_store(
    root: str | Path, *, spec: CampaignSpec, env: Mapping[str, str] | None = None
) -> Fence | None:
    """The store's manifest as found now (the close's fence), or a refusal when the store holds
    the campaign closed for good and ``root`` is not that sealed folder.

    Args:
        root: This host's output folder (it may not exist yet).
        spec: The campaign's spec (its ``storage.url``).
        env: The environment the store's variables come from (default: ``os.environ``).

    Returns:
        None for a local store (the folder's writer lock guards it), else the ``Fence``.

    Raises:
        FolderError: The store's ``manifest.json`` seals the campaign for good and the folder's
            own manifest is missing or another: nothing was written (one paragraph: where the
            sealed folder is and how to bring it here).
        SettingError: The store could not be read.
    """
    url = spec.storage.url
    if not is_s3(url):
        return None
    store = open_store(url, out=root, env=env, spool=False, read_wait_s=read_wait_s(spec))
    try:
        data = store.read_bytes(MANIFEST)
    except NotFound:
        return Fence(manifest_sha256=None)
    except StorageError as exc:
        raise SettingError(
            f"field 'storage.url': {url}/{MANIFEST} could not be read ({exc}), so whether "
            "another host closed this campaign is not known; nothing was written. Rerun when "
            "the store answers.",
            field="storage.url",
        ) from None
    sealed = sealed_for_good(data)
    local = Path(root) / MANIFEST
    mine = sha256_file(local) if local.is_file() else None
    if sealed is not None and sealed != mine:
        here = f"its manifest.json has sha256 {mine}" if mine else "it has no manifest.json"
        raise FolderError(
            f"The campaign '{spec.name}' was closed for good in {url} (manifest.json sha256 "
            f"{sealed}), and this host's output folder '{root}' is not that sealed folder "
            f"({here}): it is an older copy. A stale copy never writes over a sealed campaign: "
            "nothing was trained, written here or sent to the store. Bring the sealed folder "
            f"here with `campaign retrieve {url} --to NEW_FOLDER`, then `campaign verify "
            f"NEW_FOLDER --expect {sealed}`; to train again, start a new campaign with a new "
            "storage.url.",
            field="out",
        )
    return Fence(manifest_sha256=sha256_bytes(data))
