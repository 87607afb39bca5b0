"""Data on every node (issue 34, item 1): what the job owns is shipped through the object store
into a node-local, content-addressed copy and the paths that name it are rewritten; what the
user gives is checked where the actor starts, with a one-line refusal naming the node, the
path and the fix. The test process plays the part of an actor on another node by removing or
changing the driver's copy after shipping."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memprism_ray.actors.node_data import NodeData, NodeDataError, _rebase, ship
from memprism_ray.benchmark import DataTree
from memprism_ray.io_atomic import sha256_path

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
    import memprism_ray.actors.node_data as nd

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
    import memprism_ray.actors.node_data as nd

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


def test_a_tree_that_changed_after_it_was_shipped_is_refused_not_used(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memprism_ray.actors.node_data as nd

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
