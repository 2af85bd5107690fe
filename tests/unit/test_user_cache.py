"""`user_cache_dir`: the one root the dataset cache, a Ray node's venvs and the sandbox's
compiled shim all live under."""

from pathlib import Path

from osmosis.user_cache import user_cache_dir


def test_xdg_cache_home_names_the_root_and_an_empty_one_means_the_default(tmp_path):
    assert user_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "osmosis"
    default = Path.home() / ".cache" / "osmosis"
    assert user_cache_dir({"XDG_CACHE_HOME": ""}) == default
    assert user_cache_dir({}) == default
