"""Importing logits another tool wrote: never by unsafe loading."""

import pytest

from cactus_theory.traces import TraceError, import_logits


def test_import_logits_never_suggests_unsafe_loading(tmp_path):
    import pickle

    bad = tmp_path / "x.npz"
    bad.write_bytes(pickle.dumps({"draft_logits": [1]}))
    with pytest.raises(TraceError) as info:
        import_logits(bad, tmp_path / "t")
    assert "allow_pickle" not in str(info.value) and "pickled objects are never loaded" in str(info.value)
