"""The campaign's inputs: the corpus (tables and the bundled digits), pinned files and folders."""

from gpucampaign.data.corpus import Corpus, load_corpus, load_spec_corpus, open_corpus
from gpucampaign.data.pins import Pinned, pin, resolve_inputs

__all__ = [
    "Corpus",
    "Pinned",
    "load_corpus",
    "load_spec_corpus",
    "open_corpus",
    "pin",
    "resolve_inputs",
]
