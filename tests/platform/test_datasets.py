"""Datasets on the platform: streamed, verified uploads; immutable versions; members only.

A real server process and real git repositories. Each CLI command is driven as users run it;
facts the CLI is not the subject of are checked over HTTP (faster), as is what the CLI would
never send: wrong hashes, short bodies, hostile names.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from osmosis.workspace import resolve_workspace
from tests.platform.conftest import clean_env, free_port, osmosis, osmosis_json
from tests.platform.test_workspaces import cli, cli_error, cli_json, make_repo, new_user

pytestmark = pytest.mark.slow


def rows_jsonl(count: int, *, tag: str = "q") -> bytes:
    lines = [
        json.dumps({"user_prompt": f"{tag} {i} x 2?", "ground_truth": str(i * 2)})
        for i in range(count)
    ]
    return ("\n".join(lines) + "\n").encode()


def csv_rows(tag: str) -> bytes:
    lines = ["user_prompt,ground_truth", *(f"{tag} {i},{i}" for i in range(4))]
    return ("\n".join(lines) + "\n").encode()


def write(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    return data


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Api:
    """HTTP as one user in one workspace."""

    url: str
    token: str
    git: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "X-Osmosis-Git": self.git}

    def upload(
        self,
        file_name: str,
        data: bytes,
        *,
        size: int | None = None,
        digest: str | None = None,
        overwrite: bool = False,
    ) -> httpx.Response:
        """An upload as a client that may lie about the size or hash would send it."""
        params = {
            "file_name": file_name,
            "size": len(data) if size is None else size,
            "sha256": digest or sha(data),
            "overwrite": str(overwrite).lower(),
        }
        return httpx.post(
            f"{self.url}/api/datasets", params=params, headers=self.headers, content=data
        )

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}/api/datasets{path}", headers=self.headers, params=params)

    def info(self, name: str) -> dict[str, Any]:
        answer = self.get(f"/{name}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def api_for(platform, tree: Path, token: str | None = None) -> Api:
    git = resolve_workspace(tree).identity
    return Api(platform.url, token or platform.admin_token, git)


def blobs(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "blobs" / "datasets").iterdir())


@pytest.fixture(scope="module")
def tree(running_platform, tmp_path_factory) -> Path:
    """A repository whose workspace the admin owns, holding the dataset `qa` (uploaded by
    the CLI)."""
    tree = make_repo(tmp_path_factory.mktemp("datasets"))
    write(tree / "qa.jsonl", rows_jsonl(6))
    cli_json("dataset", "upload", "qa.jsonl", env=running_platform.env, cwd=tree)
    return tree


# -- the user's round trip --------------------------------------------------------------------
def test_upload_then_list_info_preview_download_and_logs(running_platform, tree):
    env = running_platform.env
    data = (tree / "qa.jsonl").read_bytes()

    listing = cli_json("dataset", "list", env=env, cwd=tree)
    (item,) = [i for i in listing["items"] if i["name"] == "qa"]
    assert (item["status"], item["version"], item["rows"]) == ("uploaded", 1, 6)
    assert item["sha256"] == sha(data) and item["size_bytes"] == len(data)
    assert listing["git"]["identity"] and listing["has_more"] is False
    table = cli("dataset", "list", env={**env, "COLUMNS": "200"}, cwd=tree).stdout
    assert "qa" in table and "uploaded" in table

    info = cli_json("dataset", "info", "qa", env=env, cwd=tree)["data"]
    assert info["columns"] == ["user_prompt", "ground_truth"] and info["mode"] == "prompt"
    assert info["created_by"] == "admin" and info["file_name"] == "qa.jsonl"

    preview = cli_json("dataset", "preview", "qa", "--rows", "2", env=env, cwd=tree)
    assert [r["user_prompt"] for r in preview["items"]] == ["q 0 x 2?", "q 1 x 2?"]
    assert preview["total_count"] == 6 and preview["has_more"] is True
    default = api_for(running_platform, tree).get("/qa/preview").json()
    assert len(default["rows"]) == 5  # the CLI's default --rows is the server's default

    # Default target: ./<file name>.
    sub = tree / "sub"
    sub.mkdir()
    done = cli_json("dataset", "download", "qa", env=env, cwd=sub)
    assert (sub / "qa.jsonl").read_bytes() == data
    assert done["resource"]["path"] == str(sub / "qa.jsonl")
    assert not list(sub.glob("*.partial"))

    logs = cli_json("dataset", "logs", "qa", env=env, cwd=tree)["items"]
    assert [line["step"] for line in logs] == ["upload", "verify", "validate"]
    assert "6 rows" in logs[-1]["message"] and logs[0]["version"] == 1


def test_download_refuses_to_clobber_a_file_without_overwrite(running_platform, tree, tmp_path):
    env = running_platform.env
    target = tmp_path / "mine.jsonl"
    write(target, b"precious\n")

    refused = cli_error("dataset", "download", "qa", "-o", str(target), env=env, cwd=tree)
    assert refused["code"] == "CONFLICT" and refused["details"]["path"] == str(target)
    assert target.read_bytes() == b"precious\n"

    cli_json("dataset", "download", "qa", "-o", str(target), "--overwrite", env=env, cwd=tree)
    assert target.read_bytes() == (tree / "qa.jsonl").read_bytes()

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    special = cli_error(
        "dataset", "download", "qa", "-o", str(fifo), "--overwrite", env=env, cwd=tree
    )
    assert "not a regular file" in special["message"] and fifo.is_fifo()

    nowhere = str(tmp_path / "no" / "x.jsonl")
    missing_dir = cli_error("dataset", "download", "qa", "-o", nowhere, env=env, cwd=tree)
    assert missing_dir["code"] == "VALIDATION" and "does not exist" in missing_dir["message"]


def test_upload_validates_locally_and_names_every_problem(running_platform, tree):
    (tree / "broken.jsonl").write_text(
        '{"user_prompt": "a", "ground_truth": "1"}\n'
        '{"user_prompt": "", "ground_truth": "2"}\n'
        "not json\n",
        encoding="utf-8",
    )
    error = cli_error("dataset", "upload", "broken.jsonl", env=running_platform.env, cwd=tree)
    assert error["code"] == "VALIDATION" and error["details"]["total_problems"] >= 2
    assert any(":2:" in line for line in error["details"]["errors"])
    assert any(":3:" in line for line in error["details"]["errors"])
    # Nothing reached the platform.
    assert api_for(running_platform, tree).get("/broken").status_code == 404


# -- versions ---------------------------------------------------------------------------------
def test_a_clash_needs_overwrite_which_adds_a_version_and_keeps_the_old_one(
    running_platform, tmp_path
):
    env = running_platform.env
    repo = make_repo(tmp_path)
    api = api_for(running_platform, repo)
    first = write(repo / "ver.jsonl", rows_jsonl(5, tag="old"))
    created = api.upload("ver.jsonl", first).json()

    second = write(repo / "ver.jsonl", rows_jsonl(7, tag="new"))
    clash = cli_error("dataset", "upload", "ver.jsonl", env=env, cwd=repo)
    assert clash["code"] == "CONFLICT"
    assert clash["details"]["existing_dataset_id"] == created["id"]
    human = cli("dataset", "upload", "ver.jsonl", env=env, cwd=repo)
    assert "--overwrite" in human.stderr and human.returncode == 1

    unconfirmed = cli_error("dataset", "upload", "ver.jsonl", "--overwrite", env=env, cwd=repo)
    assert unconfirmed["code"] == "INTERACTIVE_REQUIRED"
    assert "version 2" in unconfirmed["details"]["prompt"]
    assert api.info("ver")["version"] == 1  # nothing was sent

    replaced = cli_json("dataset", "upload", "ver.jsonl", "--overwrite", "-y", env=env, cwd=repo)
    assert replaced["resource"]["version"] == 2 and replaced["resource"]["rows"] == 7
    assert replaced["resource"]["id"] == created["id"]

    newest = api.info("ver")
    assert (newest["version"], newest["sha256"], newest["version_count"]) == (2, sha(second), 2)
    old = cli_json("dataset", "info", "ver", "--version", "1", env=env, cwd=repo)["data"]
    assert (old["status"], old["sha256"], old["rows"]) == ("uploaded", sha(first), 5)
    cli_json("dataset", "download", "ver", "--version", "1", "-o", "v1.jsonl", env=env, cwd=repo)
    assert (repo / "v1.jsonl").read_bytes() == first
    assert api.get("/ver/download").content == second
    assert api.get("/ver", version=3).status_code == 404


def test_a_clash_is_reported_before_the_file_is_validated(running_platform, tree):
    # Validating a large file takes minutes; a forgotten --overwrite must not cost them.
    (tree / "qa.jsonl").rename(tree / "qa.keep")
    try:
        (tree / "qa.jsonl").write_text("not json\n", encoding="utf-8")
        clash = cli_error("dataset", "upload", "qa.jsonl", env=running_platform.env, cwd=tree)
    finally:
        (tree / "qa.keep").replace(tree / "qa.jsonl")
    assert clash["code"] == "CONFLICT" and "uploaded)" in clash["message"]
    assert (
        clash["details"]["existing_dataset_id"] == api_for(running_platform, tree).info("qa")["id"]
    )


def test_the_same_bytes_under_two_names_are_stored_once(running_platform, tmp_path):
    api = api_for(running_platform, make_repo(tmp_path))
    data = rows_jsonl(4, tag="twin")
    for name in ("twin_a", "twin_b"):
        assert api.upload(f"{name}.jsonl", data).status_code == 201

    assert blobs(running_platform.home).count(f"{sha(data)}.jsonl") == 1
    for name in ("twin_a", "twin_b"):
        download = api.get(f"/{name}/download")
        assert download.content == data and download.headers["x-osmosis-sha256"] == sha(data)
        assert f'filename="{name}.jsonl"' in download.headers["content-disposition"]


def test_parquet_and_metadata_mode_datasets_preview_as_stored(running_platform, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    api = api_for(running_platform, make_repo(tmp_path))
    table = pa.table(
        {
            "user_prompt": [f"p{i}" for i in range(4)],
            "metadata": [{"level": i, "tags": {"kind": "math"}} for i in range(4)],
        }
    )
    pq.write_table(table, tmp_path / "meta.parquet")
    data = (tmp_path / "meta.parquet").read_bytes()

    created = api.upload("meta.parquet", data)
    assert created.status_code == 201, created.text
    assert (created.json()["format"], created.json()["mode"]) == ("parquet", "metadata")
    preview = api.get("/meta/preview", rows=2).json()
    assert preview["rows"][1] == {
        "user_prompt": "p1",
        "metadata": {"level": 1, "tags": {"kind": "math"}},
    }
    assert api.get("/meta/download").content == data
    assert f"{sha(data)}.parquet" in blobs(running_platform.home)


# -- the server trusts nothing -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("file_name", "rule"),
    [
        ("../x.jsonl", "cannot contain /"),
        ("a/b.jsonl", "cannot contain /"),
        ("a\\b.jsonl", "cannot contain /"),
        ("a\x00b.jsonl", "control characters"),
        (".hidden.jsonl", "cannot start with a dot"),
        ("..jsonl", "cannot start with a dot"),
        ("data.txt", "Unsupported file type '.txt'"),
    ],
)
def test_unsafe_names_are_refused_naming_the_rule(running_platform, tree, file_name, rule):
    answer = api_for(running_platform, tree).upload(file_name, rows_jsonl(4))
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "VALIDATION"
    assert rule in answer.json()["error"]["message"]


@pytest.mark.parametrize("first, second", [("Case", "case"), ("Ünï", "ünï")])
def test_names_that_differ_only_in_case_are_one_name(running_platform, tmp_path, first, second):
    # `Case.jsonl` and `case.jsonl` are one file on macOS and Windows.
    repo = make_repo(tmp_path)
    api = api_for(running_platform, repo)
    assert api.upload(f"{first}.jsonl", rows_jsonl(4)).status_code == 201
    clash = api.upload(f"{second}.jsonl", rows_jsonl(5))
    assert clash.status_code == 409, clash.text
    error = clash.json()["error"]
    assert error["details"]["existing_name"] == first and "letter case" in error["message"]
    missing = cli_error("dataset", "info", second, env=running_platform.env, cwd=repo)
    assert missing["code"] == "NOT_FOUND" and missing["details"]["did_you_mean"] == first
    assert api.upload(f"{first}.jsonl", rows_jsonl(6), overwrite=True).status_code == 201


def test_unsafe_names_are_refused_by_the_cli_and_the_read_routes(running_platform, tree):
    env = running_platform.env
    for args in (["info", "../qa"], ["download", ".."]):
        error = cli_error("dataset", *args, env=env, cwd=tree)
        assert error["code"] == "VALIDATION" and "dataset name" in error["message"]
    write(tree / ".secret.jsonl", rows_jsonl(4))
    hidden = cli_error("dataset", "upload", ".secret.jsonl", env=env, cwd=tree)
    assert "cannot start with a dot" in hidden["message"]

    api = api_for(running_platform, tree)
    for path in ("/%2E%2E", "/%2E%2E/download", "/a%5Cb/logs", "/%2Eqa/preview"):
        answer = api.get(path)
        assert answer.status_code == 422, path
        assert "dataset name" in answer.json()["error"]["message"]


def test_a_short_or_corrupted_body_never_becomes_uploaded(running_platform, tree):
    env = running_platform.env
    api = api_for(running_platform, tree)
    data = rows_jsonl(5, tag="body")

    corrupted = api.upload("corrupt.jsonl", data, digest=sha(b"other"))
    assert corrupted.status_code == 422
    assert "does not match" in corrupted.json()["error"]["message"]
    # Declares 50 more bytes than it sends: the body ends short.
    short = api.upload("short.jsonl", data, size=len(data) + 50)
    assert short.status_code == 422 and "expected" in short.json()["error"]["message"]

    for name in ("corrupt", "short"):
        assert api.info(name)["status"] == "error"
        for route in ("preview", "download"):
            refused = api.get(f"/{name}/{route}")
            assert refused.status_code == 409 and "failed" in refused.json()["error"]["message"]
    info = cli_json("dataset", "info", "corrupt", env=env, cwd=tree)["data"]
    assert info["status"] == "error" and info["hint"] == "osmosis dataset logs corrupt"
    refused = cli_error("dataset", "preview", "corrupt", env=env, cwd=tree)
    assert refused["code"] == "CONFLICT" and "dataset logs corrupt" in refused["message"]
    logs = api.get("/corrupt/logs").json()["logs"]
    assert logs[-1]["level"] == "error" and "SHA-256" in logs[-1]["message"]
    assert not [name for name in blobs(running_platform.home) if name.startswith(".partial")]


def test_the_server_revalidates_and_keeps_nothing_invalid(running_platform, tree):
    api = api_for(running_platform, tree)
    tiny = rows_jsonl(2, tag="tiny")  # the CLI would refuse it; a raw client may not

    answer = api.upload("tiny.jsonl", tiny)
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert "A minimum of 4 rows is required" in error["message"]
    assert error["details"]["problems"] and error["details"]["status"] == "error"
    assert f"{sha(tiny)}.jsonl" not in blobs(running_platform.home)
    logs = api.get("/tiny/logs").json()["logs"]
    assert any("minimum of 4 rows" in line["message"] for line in logs)

    # Every upload of `tiny` failed, so the name holds nothing: a fixed file needs no overwrite.
    write(tree / "tiny.jsonl", rows_jsonl(4, tag="tiny"))
    fixed = cli_json("dataset", "upload", "tiny.jsonl", env=running_platform.env, cwd=tree)
    assert (fixed["resource"]["status"], fixed["resource"]["version"]) == ("uploaded", 2)


# -- paging -----------------------------------------------------------------------------------
def test_first_uploads_at_once_to_a_new_workspace_all_succeed(running_platform, tmp_path):
    # Each request finds no workspace and creates it; the losers of that race use the
    # winner's instead of answering 409 (CI saw one in 51 fail so).
    api = api_for(running_platform, make_repo(tmp_path))
    names = [f"first{i}" for i in range(8)]
    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda n: api.upload(f"{n}.csv", csv_rows(n)), names))
    assert [a.status_code for a in answers] == [201] * len(names), [a.text for a in answers]
    assert api.get("").json()["total_count"] == len(names)


def test_list_pages_with_limit_and_all(running_platform, tmp_path):
    env = running_platform.env
    repo = make_repo(tmp_path)
    api = api_for(running_platform, repo)
    names = [f"ds{i:02d}" for i in range(51)]  # one more than a page
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda n: api.upload(f"{n}.csv", csv_rows(n)).status_code, names))
    assert codes == [201] * len(names)

    first = cli_json("dataset", "list", "--limit", "3", env=env, cwd=repo)
    assert [item["name"] for item in first["items"]] == names[:3]
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (51, True, 3)

    everything = cli_json("dataset", "list", "--all", env=env, cwd=repo)
    assert [item["name"] for item in everything["items"]] == names
    assert everything["has_more"] is False and everything["next_offset"] is None

    both = cli("--json", "dataset", "list", "--all", "--limit", "3", env=env, cwd=repo)
    assert both.returncode == 2  # a usage error, like any other contradictory options
    assert json.loads(both.stderr)["error"]["code"] == "VALIDATION"
    assert api.get("", limit=51).status_code == 422
    last = api.get("", limit=50, offset=50).json()
    assert [d["name"] for d in last["datasets"]] == names[50:] and last["has_more"] is False


def test_list_and_logs_tables_are_readable_at_80_columns(running_platform, tree):
    narrow = {**running_platform.env, "COLUMNS": "80"}
    listing = cli("dataset", "list", env=narrow, cwd=tree).stdout
    (row,) = [line for line in listing.splitlines() if line.startswith("│ qa ")]
    # The whole update time and a readable size, not "2026-12-01T05:2…" and a byte count.
    assert re.search(r"│ \d{4}-\d\d-\d\d \d\d:\d\d │", row) and "…" not in row, listing
    assert re.search(r"\d+ B ", row), row
    logs = cli("dataset", "logs", "qa", env=narrow, cwd=tree).stdout
    assert max(len(line) for line in logs.splitlines()) <= 80
    # A short local time leaves the message column room ("2026-12-01T05:21:33+00:00" did not).
    assert re.search(r"│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d │", logs), logs


def test_logs_page_with_a_cursor_oldest_first(running_platform, tree):
    env = running_platform.env
    api = api_for(running_platform, tree)
    everything = api.get("/qa/logs").json()
    assert everything["next_cursor"] is None and len(everything["logs"]) == 3

    page = cli_json("dataset", "logs", "qa", "--limit", "2", env=env, cwd=tree)
    assert len(page["items"]) == 2 and page["has_more"] is True
    rest = cli_json(
        "dataset", "logs", "qa", "--limit", "2", "--cursor", page["next_cursor"], env=env, cwd=tree
    )
    seen = [line["message"] for line in page["items"] + rest["items"]]
    assert seen == [line["message"] for line in everything["logs"]]
    assert rest["next_cursor"] is None
    assert api.get("/qa/logs", limit=201).status_code == 422
    assert api.get("/qa/logs", cursor="not-a-cursor").status_code == 422


# -- who sees what --------------------------------------------------------------------------------
def test_other_users_cannot_see_or_touch_a_workspaces_datasets(running_platform, tree, tmp_path):
    _, as_eve = new_user(running_platform, "eve")
    eve = api_for(running_platform, tree, token=as_eve["OSMOSIS_TOKEN"])

    for command in (["list"], ["info", "qa"]):
        error = cli_error("dataset", *command, env=as_eve, cwd=tree)
        assert error["code"] == "NOT_FOUND"
        assert "qa" not in error["message"] and "exist" not in error["message"]
    for path in ("/qa/download", "/qa/preview", "/qa/logs", "/qa"):
        answer = eve.get(path)
        assert answer.status_code == 404 and b"user_prompt" not in answer.content
    assert eve.upload("qa.jsonl", rows_jsonl(4), overwrite=True).status_code == 404

    # In her own workspace a name used elsewhere is as unknown as one never used. Only an
    # admin creates workspaces (OSMOSIS_WORKSPACE_CREATION=admin, the default).
    eve_tree = make_repo(tmp_path, "eve-tree")
    cli_json(
        "workspace", "create", "--owner", "eve@example.com", env=running_platform.env, cwd=eve_tree
    )
    own = api_for(running_platform, eve_tree, token=eve.token)
    assert own.get("").json()["total_count"] == 0
    taken, never = own.get("/qa").json()["error"], own.get("/never").json()["error"]
    assert taken["code"] == never["code"] == "NOT_FOUND"
    assert taken["message"].replace("qa", "X") == never["message"].replace("never", "X")
    assert api_for(running_platform, tree).info("qa")["version"] == 1


# -- crashes and restarts -------------------------------------------------------------------------
SLOW_UPLOADER = """
import hashlib, sys, time, httpx
url, token, git = sys.argv[1:4]
lines, delay = int(sys.argv[4]), float(sys.argv[5])
data = b'{"user_prompt": "slow", "ground_truth": "1"}\\n' * lines
def chunks():
    for number, start in enumerate(range(0, len(data), 200)):
        if number == 2:  # the first chunk has been taken by the transport
            print("streaming", flush=True)
        yield data[start:start + 200]
        time.sleep(delay)
params = {"file_name": "slow.jsonl", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
headers = {"Authorization": f"Bearer {token}", "X-Osmosis-Git": git,
           "Content-Length": str(len(data))}
httpx.post(f"{url}/api/datasets", params=params, headers=headers, content=chunks(), timeout=120)
"""


def start_slow_upload(api: Api, *, lines: int, delay: float) -> subprocess.Popen[str]:
    """A real client process streaming `slow.jsonl` 200 bytes every `delay` seconds; returns
    once it has sent its first chunk."""
    uploader = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPLOADER, api.url, api.token, api.git, str(lines), str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # it dies of a reset connection in one test
        text=True,
        env=clean_env(),
    )
    assert uploader.stdout is not None and uploader.stdout.readline() == "streaming\n"
    return uploader


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def wait_for_status(api: Api, name: str, wanted: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        info = api.info(name)
        if info["status"] == wanted or time.monotonic() > deadline:
            return info
        time.sleep(0.1)


def test_a_client_killed_mid_upload_leaves_an_error_never_uploaded(running_platform, tree):
    api = api_for(running_platform, tree)
    # ~20 s at full speed; it is killed long before.
    uploader = start_slow_upload(api, lines=2000, delay=0.05)
    try:
        assert api.info("slow")["status"] == "uploading"
        refused = api.get("/slow/download")
        assert refused.status_code == 409 and "uploading" in refused.json()["error"]["message"]
    finally:
        kill(uploader)
    after = wait_for_status(api, "slow", "error")
    assert after["status"] == "error" and "interrupted" in after["error"]
    assert not [name for name in blobs(running_platform.home) if name.startswith(".partial")]

    write(tree / "slow.jsonl", rows_jsonl(4, tag="slow"))
    again = cli_json("dataset", "upload", "slow.jsonl", env=running_platform.env, cwd=tree)
    assert (again["resource"]["status"], again["resource"]["version"]) == ("uploaded", 2)


@dataclass
class OwnPlatform:
    env: dict[str, str]
    home: Path
    url: str

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials.json").read_text())["token"])


@pytest.fixture
def own_platform(tmp_path, databases) -> Iterator[OwnPlatform]:
    """A server of this test's own (it is stopped, killed and restarted), with a 4 KB cap."""
    home = tmp_path / "home"
    env = clean_env(
        OSMOSIS_HOME=str(home),
        OSMOSIS_CONFIG_DIR=str(tmp_path / "config"),
        OSMOSIS_MAX_UPLOAD_BYTES="4096",
        **databases.env(home),
    )
    port = free_port()
    started = osmosis_json("server", "start", "--detach", "--port", str(port), env=env)
    try:
        yield OwnPlatform(env, home, str(started["resource"]["url"]))
    finally:
        osmosis("server", "stop", env=env)


def test_the_cap_restarts_and_a_crash_mid_upload(own_platform, tmp_path):
    env = own_platform.env
    repo = make_repo(tmp_path, "repo")
    api = api_for(own_platform, repo)
    data = write(repo / "keep.jsonl", rows_jsonl(4))
    cli_json("dataset", "upload", "keep.jsonl", env=env, cwd=repo)

    write(repo / "big.jsonl", rows_jsonl(200))
    too_big = cli_error("dataset", "upload", "big.jsonl", env=env, cwd=repo)
    assert too_big["code"] == "PAYLOAD_TOO_LARGE" and too_big["details"]["status_code"] == 413
    assert "at most 4,096" in too_big["message"]
    assert api.get("/big").status_code == 404

    # A clean stop and start loses nothing.
    assert osmosis("server", "stop", env=env).returncode == 0
    started = osmosis_json("server", "start", "--detach", "--port", str(free_port()), env=env)
    api.url = started["resource"]["url"]
    cli_json("dataset", "download", "keep", "-o", "back.jsonl", env=env, cwd=repo)
    assert (repo / "back.jsonl").read_bytes() == data

    # A crash mid-upload: the version can never finish, so the next start fails it.
    uploader = start_slow_upload(api, lines=80, delay=0.25)  # 3,600 bytes in ~4.5 s
    try:
        assert api.info("slow")["status"] == "uploading"
        # The server this test started, nothing else.
        os.kill(int(started["resource"]["pid"]), signal.SIGKILL)
    finally:
        kill(uploader)
    assert [name for name in blobs(own_platform.home) if name.startswith(".partial")]

    started = osmosis_json("server", "start", "--detach", "--port", str(free_port()), env=env)
    api.url = started["resource"]["url"]
    info = api.info("slow")
    assert info["status"] == "error" and "server stopped" in info["error"]
    assert not [name for name in blobs(own_platform.home) if name.startswith(".partial")]
    assert api.get("/slow/logs").json()["logs"][-1]["step"] == "recover"
    assert api.get("/keep/download").content == data
