"""Data on every node (issue 34, item 1): what the job owns is shipped through the object store
into a node-local, content-addressed copy and the paths that name it are rewritten; what the
user gives is checked where the actor starts, with a one-line refusal naming the node, the
path and the fix. The test process plays the part of an actor on another node by removing or
changing the driver's copy after shipping."""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import cloudpickle
import pytest

import memprism_ray.cluster.node_data as nd
from memprism_ray.benchmark import DataTree
from memprism_ray.cluster.node_data import NodeData, NodeDataError, ShippedTree, _rebase, on_this_node, ship
from memprism_ray.io_atomic import file_lock, sha256_path

pytestmark = [pytest.mark.ray]


def _tree(root: Path) -> Path:
    (root / "json" / "game-1").mkdir(parents=True)
    (root / "json" / "game-1" / "game.tw-pddl").write_text('{"pddl": 1}')
    (root / "logic.pddl").write_text("(define)")
    return root


@dataclasses.dataclass(frozen=True)
class _Corpus:
    data_root: str
    other: str = "/elsewhere"


@dataclasses.dataclass(frozen=True)
class _Cfg:
    corpus: _Corpus
    options: dict
    paths: tuple


def test_tree_digest_follows_content_and_names(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a")
    b = _tree(tmp_path / "b")
    assert sha256_path(a) == sha256_path(b)  # where it lies does not matter
    (b / "logic.pddl").write_text("(define x)")
    assert sha256_path(a) != sha256_path(b)
    (b / "logic.pddl").write_text("(define)")
    (b / "logic.pddl").rename(b / "logic2.pddl")
    assert sha256_path(a) != sha256_path(b)


def test_rebase_rewrites_every_path_under_a_root_and_nothing_else() -> None:
    cfg = _Cfg(
        _Corpus("/driver/corpus"),
        {"config": _Corpus("/driver/corpus/sub", "/driver/corpusX/f"), "n": 3},
        ("/driver/corpus/json/g", Path("/driver/corpus/logic.pddl"), "/driver/corp"),
    )
    out = _rebase(cfg, [("/driver/corpus", lambda: "/node/copy/corpus")])
    assert out.corpus.data_root == "/node/copy/corpus"
    assert out.options["config"].data_root == "/node/copy/corpus/sub"
    assert out.options["config"].other == "/driver/corpusX/f"  # a sibling with the same prefix is not under it
    assert out.paths == ("/node/copy/corpus/json/g", Path("/node/copy/corpus/logic.pddl"), "/driver/corp")
    assert cfg.corpus.data_root == "/driver/corpus"  # the original is untouched
    same = _rebase(cfg, [("/nowhere", lambda: "/x")])
    assert same is cfg  # nothing under a root: no copy at all


def test_a_node_without_the_drivers_copy_unpacks_the_shipped_tree(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memprism_ray.cluster.node_data as nd

    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setattr(nd, "_LOCAL", {})
    root = _tree(tmp_path / "driver" / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    digest = sha256_path(root)
    # Same machine: the driver's path holds the same content, so it is read in place.
    assert data.localize({"root": str(root)}) == {"root": str(root)}
    monkeypatch.setattr(nd, "_LOCAL", {})
    monkeypatch.setattr(nd, "_same_here", lambda tree: False)  # as on a node with its own disk
    cfg = _Cfg(_Corpus(str(root)), {}, (str(root / "json" / "game-1" / "game.tw-pddl"),))
    local = data.localize(cfg)
    copy_root = Path(local.corpus.data_root)
    assert copy_root.parent.parent == tmp_path / "node-cache" / "node-data"
    assert copy_root.name == "corpus" and sha256_path(copy_root) == digest
    assert Path(local.paths[0]).read_text() == '{"pddl": 1}'
    # A second process of that node finds the finished copy without fetching again.
    monkeypatch.setattr(nd, "_LOCAL", {})
    monkeypatch.setattr(nd.ray, "get", lambda *a, **k: pytest.fail("fetched a copy the node already has"))
    assert data.localize(cfg) == local


def test_only_the_named_files_of_a_folder_are_shipped(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The D1 reference goes without its optimizer state: a folder shipped with ``files`` is
    identified and unpacked by those files only."""
    import memprism_ray.cluster.node_data as nd

    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setattr(nd, "_LOCAL", {})
    monkeypatch.setattr(nd, "_same_here", lambda tree: False)
    root = _tree(tmp_path / "ckpt")
    (root / "state.pt").write_bytes(b"x" * 1000)
    (data,) = ship([DataTree(str(root), "the D1 checkpoint", owned=True, files=("logic.pddl",))]).shipped
    assert data.size == len("(define)") and data.digest == sha256_path(root, ("logic.pddl",))
    local = Path(NodeData((data,)).localize(str(root)))
    assert sorted(p.name for p in local.iterdir()) == ["logic.pddl"]
    (root / "state.pt").write_bytes(b"y")  # what is not shipped does not change the identity
    assert sha256_path(root, ("logic.pddl",)) == data.digest


def test_on_this_node_localizes_every_argument_of_a_set_up_a_method_and_a_task(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one helper the actors localize with (issue 42): the call's ``data`` (or the actor's
    ``self.data``) moves every path under a shipped tree in every other argument; paths
    elsewhere, ``data`` itself and arguments without paths are passed as they were."""
    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setattr(nd, "_LOCAL", {})
    monkeypatch.setattr(nd, "_same_here", lambda tree: False)  # as on a node without the driver's disk
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    game = str(root / "json" / "game-1" / "game.tw-pddl")
    elsewhere = str(tmp_path / "elsewhere")

    @on_this_node
    def task(cfg: _Corpus, games: list[dict[str, str]], n: int, data: NodeData | None = None) -> tuple:
        return cfg, games, n, data

    class Actor:
        def __init__(self, data: NodeData) -> None:
            self.data = data

        @on_this_node
        def play(self, specs: list[dict[str, str]]) -> list[dict[str, str]]:
            return specs

    cfg, games, n, passed = task(_Corpus(str(root)), [{"game": game}, {"game": elsewhere}], 3, data=data)
    local = Path(cfg.data_root)
    assert local != root and (local / "logic.pddl").read_text() == "(define)"
    assert games == [{"game": str(local / "json" / "game-1" / "game.tw-pddl")}, {"game": elsewhere}]
    assert (n, passed) == (3, data)
    assert Actor(data).play([{"game": game}]) == [{"game": str(local / "json" / "game-1" / "game.tw-pddl")}]
    assert task(_Corpus(str(root)), [], 0) == (_Corpus(str(root)), [], 0, None)  # no data: nothing moved


def test_a_tree_that_changed_after_it_was_shipped_is_refused_not_used(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memprism_ray.cluster.node_data as nd

    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.setattr(nd, "_LOCAL", {})
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    (root / "logic.pddl").write_text("(define changed)")  # the driver's tree is not what the job identified
    with pytest.raises(NodeDataError, match=r"the test corpus: the copy unpacked on node .* has sha256"):
        data.localize(str(root))
    assert not list((tmp_path / "node-cache" / "node-data").glob("*/corpus"))  # nothing left to be used


def test_user_data_missing_on_a_node_is_one_line_with_node_path_and_fix(ray_session, tmp_path: Path) -> None:
    data = NodeData(checked=(DataTree(str(tmp_path / "alfworld"), "corpus.data_root", owned=False, fix="mount it"),))
    with pytest.raises(NodeDataError) as err:
        data.localize({"data_root": str(tmp_path / "alfworld" / "json")})
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"corpus.data_root {tmp_path / 'alfworld'} does not exist on node ")
    assert line.endswith(": mount it")
    (tmp_path / "alfworld").mkdir()
    assert data.localize({"data_root": str(tmp_path / "alfworld")}) == {"data_root": str(tmp_path / "alfworld")}


def test_a_user_tree_inside_another_tree_goes_with_it(ray_session, tmp_path: Path) -> None:
    """A user path inside a shipped tree (EB-ALFRED's episode list in its fixture) is not checked
    on its own, which would shadow the shipped copy (the longest root wins); one inside a user
    tree (a Mind2Web score file in the release) is checked with it; one elsewhere is kept."""
    fixture = _tree(tmp_path / "fixture")
    release = tmp_path / "release"
    (release / "scores").mkdir(parents=True)
    outside = tmp_path / "splits.json"
    data = ship(
        [
            DataTree(str(fixture), "the fixture", owned=True),
            DataTree(str(fixture / "logic.pddl"), "ebalfred.splits", owned=False),
            DataTree(str(release), "the release", owned=False),
            DataTree(str(release / "scores" / "s.pkl"), "mind2web.candidate_scores", owned=False),
            DataTree(str(release), "the release again", owned=False),
            DataTree(str(outside), "ebalfred.train_splits", owned=False),
        ]
    )
    assert [t.what for t in data.shipped] == ["the fixture"]
    assert [t.what for t in data.checked] == ["the release", "the release again", "ebalfred.train_splits"]


class _Node:
    """This test process playing the processes of one node with its own disk (issue 40): each
    has its own localized copies and its own shared locks on the copies it uses; a process that
    ends drops its locks (as the kernel does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, base: Path) -> None:
        self.monkeypatch = monkeypatch
        self.base = base
        self.alive: list[dict] = []
        monkeypatch.setattr(nd, "_same_here", lambda tree: False)
        self.new_process(end_current=False)

    def new_process(self, *, end_current: bool) -> None:
        if end_current:
            for stack in nd._HELD.values():
                stack.close()
        else:
            self.alive.append(nd._HELD)
        self.monkeypatch.setattr(nd, "_LOCAL", {})
        self.monkeypatch.setattr(nd, "_HELD", {})

    def end_all(self) -> None:
        for held in [*self.alive, nd._HELD]:
            for stack in held.values():
                stack.close()

    def copy_of(self, tree: ShippedTree) -> Path:
        return self.base / tree.digest[:32]


@pytest.fixture
def node(ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path / "node-cache"))
    monkeypatch.delenv(nd.MAX_BYTES_ENV, raising=False)
    n = _Node(monkeypatch, tmp_path / "node-cache" / "node-data")
    yield n
    n.end_all()


def _one_line_error(err: pytest.ExceptionInfo[NodeDataError], permanent: bool) -> str:
    line = str(err.value)
    assert "\n" not in line and err.value.permanent is permanent
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)
    return line


@pytest.mark.parametrize("layout", ["absolute root link", "relative root link", "links inside"])
def test_a_tree_with_symlinks_is_shipped_as_what_they_point_to(
    node: _Node, tmp_path: Path, linked_tree: tuple[Path, Path], layout: str
) -> None:
    """Issue 40: an absolute root link was refused by the tar filter, a relative one gave a digest
    mismatch, links inside pointing out of the tree were refused and left out of the digest."""
    real, plain = linked_tree
    root = {"absolute root link": tmp_path / "abs", "relative root link": tmp_path / "rel", "links inside": real}[
        layout
    ]
    if root != real:
        root.symlink_to(real if layout.startswith("absolute") else "real")
    data = ship([DataTree(str(root), "the linked tree", owned=True)])
    assert data.shipped[0].digest == sha256_path(plain)  # the digest of what a copy holds
    copy = Path(data.localize(str(root)))
    assert copy.parent == node.copy_of(data.shipped[0]) and copy.name == root.name
    assert sha256_path(copy) == sha256_path(plain)
    assert (copy / "linked" / "deep" / "c.txt").read_text() == "c"
    assert not [p for p in copy.rglob("*") if p.is_symlink()]  # every member a regular file


def test_a_tree_that_cannot_be_shipped_is_one_line_on_the_driver(ray_session, tmp_path: Path) -> None:
    root = _tree(tmp_path / "corpus")
    (root / "json" / "up").symlink_to("..")
    with pytest.raises(NodeDataError) as err:
        ship([DataTree(str(root), "the test corpus", owned=True)])
    line = _one_line_error(err, permanent=True)
    assert line == (
        f"the test corpus {root} cannot be shipped: {root}/json/up is a symlink to .., a folder that contains it "
        "(a loop): remove the link or point it at a folder that does not contain it"
    )
    with pytest.raises(NodeDataError, match=r"^the test corpus .*/gone does not exist on the driver \(node "):
        ship([DataTree(str(tmp_path / "gone"), "the test corpus", owned=True)])


def test_permanent_reaches_the_fleet_through_ray() -> None:
    """The fleet reads ``getattr(cause, "permanent", ...)`` of what Ray hands back from a failed
    actor start: the cause itself, or the dual exception Ray raises, which delegates to it."""
    from ray.exceptions import RayTaskError

    for permanent in (True, False):
        err = NodeDataError("the corpus: ...", permanent=permanent)
        back = cloudpickle.loads(cloudpickle.dumps(err))
        assert back.permanent is permanent and str(back) == "the corpus: ..."
        dual = RayTaskError("RolloutWorker.__init__", "Traceback ...", back).as_instanceof_cause()
        assert isinstance(dual, NodeDataError) and dual.permanent is permanent and dual.cause.permanent is permanent
    assert NodeDataError("x").permanent is True


def test_a_fetch_that_times_out_is_transient_and_the_next_try_unpacks(
    node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.exceptions import GetTimeoutError

    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])

    def stalled(tree: ShippedTree) -> bytes:
        raise GetTimeoutError("Get timed out: some object(s) not ready.")

    with monkeypatch.context() as m:
        m.setattr(nd, "_fetch", stalled)
        with pytest.raises(NodeDataError) as err:
            data.localize(str(root))
    line = _one_line_error(err, permanent=False)
    assert re.match(
        r"the test corpus: no copy reached node \S+ \(\w{8}\) from the driver's node \(\w{8}\) within 600s", line
    )
    assert not node.copy_of(data.shipped[0]).exists() and not list(node.base.glob("*.tmp-*"))
    node.new_process(end_current=True)
    assert sha256_path(data.localize(str(root))) == data.shipped[0].digest


def test_a_tree_the_drivers_node_cannot_pack_is_permanent(node: _Node, tmp_path: Path) -> None:
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    shutil.rmtree(root)  # gone from the driver while the job runs: every node would be refused
    with pytest.raises(NodeDataError) as err:
        data.localize(str(root))
    line = _one_line_error(err, permanent=True)
    assert re.match(r"the test corpus could not be packed on the driver's node for node .*\(FileNotFoundError: ", line)
    assert line.endswith(f"keep {root} as it was when the job started")


def test_a_member_the_tar_filter_refuses_is_named(node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        link = tarfile.TarInfo("corpus/passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    monkeypatch.setattr(nd, "_fetch", lambda tree: buf.getvalue())
    with pytest.raises(NodeDataError) as err:
        data.localize(str(root))
    line = _one_line_error(err, permanent=True)
    assert re.match(
        r"the test corpus: member corpus/passwd of the copy from the driver refused on node .*\('corpus/passwd' is a "
        rf"link to an absolute path\): make it a regular file or folder in {re.escape(str(root))} on the driver$",
        line,
    )
    assert not list(node.base.glob("*.tmp-*")) and not node.copy_of(data.shipped[0]).exists()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            errno.ENOSPC,
            r"the test corpus: disk full on node .*: its copy needs 19 bytes under {base}, [\d,]+ free "
            r"\(node-data/ holds 0 bytes of other copies, unused ones evicted first\): make room for it on that disk, "
            r"or set MEMPRISM_CACHE on this node to a folder on a larger disk$",
        ),
        (
            errno.EACCES,
            r"the test corpus: could not write its copy under {base} on node .* \(.*corpus: Permission "
            r"denied\): make \$MEMPRISM_CACHE a writable folder on this node$",
        ),
    ],
)
def test_a_disk_that_refuses_the_unpack_is_one_line(
    node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, expected: str
) -> None:
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    assert data.shipped[0].size == 19

    def refused(self: tarfile.TarFile, path: Path, **kwargs: object) -> None:
        (Path(path) / "corpus").mkdir(parents=True)
        raise OSError(code, os.strerror(code), str(Path(path) / "corpus"))

    monkeypatch.setattr(tarfile.TarFile, "extractall", refused)
    with pytest.raises(NodeDataError) as err:
        data.localize(str(root))
    line = _one_line_error(err, permanent=True)
    assert re.match(expected.format(base=re.escape(str(node.base))), line), line
    assert not list(node.base.glob("*.tmp-*"))  # the partial unpack removed


def _sized_trees(tmp_path: Path, names: str, size: int = 1000) -> list[DataTree]:
    trees = []
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        (tmp_path / name / "blob").write_bytes(bytes([i]) * size)
        trees.append(DataTree(str(tmp_path / name), f"tree {name}", owned=True))
    return trees


def test_a_disk_too_full_evicts_unused_copies_then_fails_before_fetching(
    node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = ship(_sized_trees(tmp_path, "abc"))
    a, b, c = data.shipped
    data.localize(a.path)
    node.new_process(end_current=False)  # a stays in use
    data.localize(b.path)
    node.new_process(end_current=True)  # b's process ended
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(nd.shutil, "disk_usage", lambda p: usage._replace(free=999))
    monkeypatch.setattr(nd, "_fetch", lambda tree: pytest.fail("fetched a tree that cannot fit"))
    with pytest.raises(NodeDataError) as err:
        data.localize(c.path)
    line = _one_line_error(err, permanent=True)
    assert re.search(
        r"disk full on node .*: its copy needs 1,000 bytes under .*, 999 free \(node-data/ holds 1,\d\d\d bytes", line
    )
    assert node.copy_of(a).exists() and not node.copy_of(b).exists()  # in use kept, unused evicted


def test_the_unpack_lock_wait_is_shorter_than_a_fetch_and_transient(
    node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter gives up before the holder's fetch would, so it never starts a second full fetch
    behind a stalled one (issue 40: both were 600 s, and the wait a raw TimeoutError)."""
    assert nd.UNPACK_LOCK_TIMEOUT_S < nd.FETCH_TIMEOUT_S
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    monkeypatch.setattr(nd, "UNPACK_LOCK_TIMEOUT_S", 0.2)
    lock = node.base / f"{data.shipped[0].digest[:32]}.lock"
    with file_lock(lock, 0, what="unpacking the test corpus"), pytest.raises(NodeDataError) as err:
        data.localize(str(root))
    line = _one_line_error(err, permanent=False)
    assert re.match(
        rf"the test corpus on node \S+ \(\w{{8}}\): waited 0.2s for the lock {re.escape(str(lock))} "
        rf"\(held by process {os.getpid()}, unpacking the test corpus\); wait for that process or stop it "
        r"\(transient: the actor is started again\)$",
        line,
    )


def test_the_node_cache_keeps_to_its_bound_evicting_the_least_recently_used_copy_no_process_uses(
    node: _Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(nd.MAX_BYTES_ENV, "2500")
    data = ship(_sized_trees(tmp_path, "abcd"))
    assert data.max_bytes == 2500
    a, b, c, d = data.shipped
    for tree in (a, b):  # each read by a process that then ends
        data.localize(tree.path)
        node.new_process(end_current=True)
    os.utime(node.copy_of(a) / nd._DONE, (100, 100))
    os.utime(node.copy_of(b) / nd._DONE, (200, 200))
    data.localize(a.path)  # a used again (no unpack): now b is the least recently used
    assert (node.copy_of(a) / nd._DONE).stat().st_mtime > 200
    node.new_process(end_current=True)
    data.localize(c.path)  # a + b + c = 3,000 bytes > 2,500: b goes
    assert [p.name for p in sorted(node.base.iterdir())] == sorted(
        f"{t.digest[:32]}{suffix}" for t in (a, c) for suffix in ("", ".lock", ".use")
    )
    node.new_process(end_current=False)  # c stays in use
    NodeData(data.shipped, max_bytes=0).localize(d.path)  # keep nothing unused: a goes, c stays
    assert not node.copy_of(a).exists() and node.copy_of(c).exists() and node.copy_of(d).exists()
    assert sha256_path(node.copy_of(c) / "c") == c.digest  # whole


def test_a_bad_cache_bound_is_one_line(ray_session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nd.MAX_BYTES_ENV, "lots")
    with pytest.raises(NodeDataError, match=rf"^{nd.MAX_BYTES_ENV}='lots' is not a number of bytes >= 0: set it to"):
        ship([])
    monkeypatch.setenv(nd.MAX_BYTES_ENV, "5e9")
    assert ship([]).max_bytes == 5 * 10**9


def test_an_unpack_sweeps_what_killed_unpacks_left_but_not_one_under_way(node: _Node, tmp_path: Path) -> None:
    root = _tree(tmp_path / "corpus")
    data = ship([DataTree(str(root), "the test corpus", owned=True)])
    own = data.shipped[0].digest[:32]
    node.base.mkdir(parents=True)
    (node.base / f"{'b' * 32}.lock").touch()
    leftovers = {
        "own": node.base / f"{own}.tmp-dead0001",  # this digest: its unpacker is gone, this process holds the lock
        "lock free": node.base / f"{'b' * 32}.tmp-dead0002",
        "no lock": node.base / f"{'c' * 32}.tmp-evict-dead0003",  # an eviction killed mid-delete
        "under way": node.base / f"{'d' * 32}.tmp-live0004",
    }
    for tmp in leftovers.values():
        (tmp / "corpus").mkdir(parents=True)
        (tmp / "corpus" / "part").write_bytes(b"x" * 100)
    with file_lock(node.base / f"{'d' * 32}.lock", 0):  # another process unpacking right now
        data.localize(str(root))
    assert [k for k, tmp in leftovers.items() if tmp.exists()] == ["under way"]
