"""EB-ALFRED subsets, game references and expert plans from ALFRED training annotations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.benchmark.ebalfred import skills as sk
from memprism_ray.benchmark.ebalfred.data import (
    SPLITS_ENV,
    SUBSETS,
    game_ref,
    list_games,
    load_splits,
    parse_game_id,
    plan_from_high_pddl,
)
from memprism_ray.benchmark.ebalfred.fixture import build_fixture
from memprism_ray.benchmark.ebalfred.skills import AlfredNameError


def test_subsets_are_the_papers_six() -> None:
    assert len(SUBSETS) == 6 and set(SUBSETS) == {
        "base",
        "common_sense",
        "complex_instruction",
        "visual_appearance",
        "spatial",
        "long_horizon",
    }


def test_game_ids_round_trip_and_reject_bad_ids() -> None:
    g = game_ref("spatial", 7, "x/splits.json")
    assert (g.game_id, g.task_type, g.split) == ("spatial/7", "spatial", "spatial")
    assert parse_game_id(g.game_id) == ("spatial", 7)
    for bad in ("spatial", "spatial/x", "nope/1"):
        with pytest.raises(ValueError):
            parse_game_id(bad)
    with pytest.raises(ValueError, match="valid subsets"):
        game_ref("unseen", 0)


def test_list_games_from_splits(tmp_path: Path) -> None:
    root = build_fixture(tmp_path, episodes_per_subset=3)
    games = list_games(path=root / "splits.json")
    assert len(games) == 18 and games[0].game_id == "base/0" and games[-1].game_id == "long_horizon/2"
    two = list_games(["long_horizon", "base"], path=root / "splits.json", per_subset=2)
    assert [g.game_id for g in two] == ["long_horizon/0", "long_horizon/1", "base/0", "base/1"]


def test_missing_or_bad_splits_give_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPLITS_ENV, str(tmp_path / "absent.json"))
    with pytest.raises(FileNotFoundError, match=SPLITS_ENV):
        load_splits()
    bad = tmp_path / "splits.json"
    bad.write_text(json.dumps({"base": []}))
    with pytest.raises(ValueError, match="missing subset"):
        load_splits(bad)
    bad.write_text(json.dumps({s: [{"task": "t"}] for s in SUBSETS}))
    with pytest.raises(ValueError, match="instruction"):
        load_splits(bad)


def _plan(*steps: tuple[str, list[str]]) -> list[dict]:
    return [{"discrete_action": {"action": a, "args": args}} for a, args in steps]


def skills_from_high_pddl(plan: list, low: list | tuple = ()) -> list[str]:
    """The translated plan's skills with their bare type names."""
    return [s.skill for s in plan_from_high_pddl(plan, low)]


def _low(*acts: tuple[int, str, str, str]) -> list[dict]:
    """ALFRED low actions: (high_idx, api action, objectId type, receptacle type); one instance per type."""
    out = []
    for k, action, kind, receptacle in acts:
        api = {"action": action, "objectId": f"{kind}|+01.00|+00.90|-01.00"}
        if receptacle:
            api["receptacleObjectId"] = f"{receptacle}|+01.00|+00.90|-01.00"
        out.append({"high_idx": k, "api_action": api})
    return out


#: Every plan argument of the 1267 ALFRED trajectory files EmbodiedBench ships
#: (embodiedbench/envs/eb_alfred/data/json_2.1.0/*/*/pp/ann_*.json, b247936), as ALFRED writes them.
EMBODIEDBENCH_PLAN_ARGS = (
    "apple", "armchair", "baseballbat", "bathtubbasin", "bed", "book", "bowl", "box", "bread", "butterknife",
    "cabinet", "candle", "cart", "cd", "cellphone", "cloth", "coffeemachine", "coffeetable", "countertop",
    "creditcard", "cup", "desk", "desklamp", "diningtable", "dishsponge", "drawer", "dresser", "floorlamp", "fork",
    "fridge", "garbagecan", "handtowel", "handtowelholder", "keychain", "knife", "ladle", "lettuce", "microwave",
    "mug", "newspaper", "ottoman", "pan", "pen", "pencil", "pillow", "plate", "plunger", "pot", "potato",
    "remotecontrol", "safe", "shelf", "sidetable", "sinkbasin", "soapbar", "soapbottle", "sofa", "spatula",
    "spoon", "spraybottle", "statue", "stoveburner", "tennisracket", "tissuebox", "toilet", "toiletpaper",
    "toiletpaperhanger", "tomato", "vase", "watch", "wateringcan",
)  # fmt: skip


def test_every_alfred_object_name_maps_to_a_skill_of_the_list() -> None:
    """Issue 35 item 1: ALFRED writes its plans in lower case (``diningtable``); before, the
    loaders called the translation without the name table and got ``find a Diningtable``,
    which is none of the 162 skills. Every type of the skill tables (multi-word, basins and
    ``Sliced`` forms included) now reaches a skill of the list, through one table."""
    valid = set(sk.global_skills())

    def one(verb: str, name: str) -> list[str]:
        return skills_from_high_pddl(_plan((verb, [name])))

    for obj in sk.ALFRED_OBJS:
        assert one("GotoLocation", obj.lower()) == [f"find a {obj}"]
        assert sk.alfred_object(obj.upper()) == obj  # case-insensitive
    for obj in sk.PICK_OBJS:
        assert one("PickupObject", obj.lower()) == [f"pick up the {obj}"]
    for obj in sk.SLICE_OBJS:
        assert one("SliceObject", obj.lower()) == [f"slice the {obj}"]
        assert one("PickupObject", f"{obj.lower()}sliced") == [f"pick up the {obj}"]  # ALFRED's AppleSliced
    for obj in sk.TOGGLE_OBJS:
        assert one("ToggleObject", obj.lower()) == [f"turn on the {obj}"]
    for obj in sk.OPEN_OBJS:
        assert one("OpenObject", obj.lower()) == [f"open the {obj}"]
        assert one("CloseObject", obj.lower()) == [f"close the {obj}"]
    assert one("GotoLocation", "sinkbasin") == ["find a Sink"]  # ALFRED's basins: EB-ALFRED's Sink, Bathtub
    assert one("GotoLocation", "bathtubbasin") == ["find a Bathtub"]
    assert one("GotoLocation", "diningtable") == ["find a DiningTable"]  # was "find a Diningtable"
    for name in EMBODIEDBENCH_PLAN_ARGS:  # real names; a holder is found through the object it holds
        plan = _plan(("GotoLocation", [name]), ("PickupObject", ["handtowel"]))
        assert all(skill in valid for skill in skills_from_high_pddl(plan)), name
        if name != "handtowelholder":
            assert one("GotoLocation", name)[0] in valid


def test_a_name_no_skill_has_is_an_error_naming_it() -> None:
    with pytest.raises(AlfredNameError, match="'diningtabel' in GotoLocation is not an ALFRED object") as err:
        skills_from_high_pddl(_plan(("GotoLocation", ["diningtabel"])))
    assert err.value.name == "diningtabel" and not err.value.known
    with pytest.raises(AlfredNameError, match=r"'towel' in PickupObject \(Towel\) has no EB-ALFRED skill") as err:
        skills_from_high_pddl(_plan(("GotoLocation", ["towelholder"]), ("PickupObject", ["towel"])))
    assert err.value.known  # a real ALFRED type the skill list leaves out: the plan cannot be played
    with pytest.raises(AlfredNameError, match="toaster"):  # a put needs a receptacle that can be found
        skills_from_high_pddl(_plan(("GotoLocation", ["toaster"]), ("PutObject", ["bread", "toaster"])))
    with pytest.raises(AlfredNameError, match="'turn on the Apple' is no EB-ALFRED skill"):
        skills_from_high_pddl(_plan(("ToggleObject", ["apple"])))


def test_real_alfred_plans_become_playable_skill_sequences() -> None:
    """Plans as ALFRED's files hold them (shapes from EmbodiedBench's shipped trajectories)."""
    clean = _plan(
        ("GotoLocation", ["countertop"]),
        ("PickupObject", ["ladle"]),
        ("GotoLocation", ["sinkbasin"]),
        ("CleanObject", [""]),  # an empty argument in some files: the held object
        ("GotoLocation", ["diningtable"]),
        ("PutObject", ["ladle", "diningtable"]),
        ("NoOp", []),
    )
    want = [
        "find a Ladle",  # the object picked up, as EmbodiedBench's examples find it (not the counter)
        "pick up the Ladle",
        "find a Sink",
        "put down the object in hand",
        "turn on the Faucet",
        "turn off the Faucet",
        "pick up the Ladle",
        "find a DiningTable",
        "put down the object in hand",
    ]
    assert skills_from_high_pddl(clean) == want
    low = _low(
        (1, "PickupObject", "Ladle", ""), (3, "PutObject", "Ladle", "Sink"),
        (3, "ToggleObjectOn", "Faucet", ""), (3, "ToggleObjectOff", "Faucet", ""),
        (3, "PickupObject", "Ladle", ""), (5, "PutObject", "Ladle", "DiningTable"),
    )  # fmt: skip
    assert skills_from_high_pddl([{**s, "high_idx": k} for k, s in enumerate(clean)], low) == want
    # Low actions show the opening and closing ALFRED does around a pickup or a put (its
    # high-level plan does not): a cabinet must be open for ThorConnector.put to succeed.
    cabinet = [
        {**s, "high_idx": k}
        for k, s in enumerate(
            _plan(
                ("GotoLocation", ["cabinet"]),
                ("PickupObject", ["cloth"]),
                ("GotoLocation", ["drawer"]),
                ("PutObject", ["cloth", "drawer"]),
            )
        )
    ]
    low = _low(
        (1, "OpenObject", "Cabinet", ""), (1, "PickupObject", "Cloth", ""), (1, "CloseObject", "Cabinet", ""),
        (3, "OpenObject", "Drawer", ""), (3, "PutObject", "Cloth", "Drawer"), (3, "CloseObject", "Drawer", ""),
    )  # fmt: skip
    assert skills_from_high_pddl(cabinet, low) == [
        "find a Cabinet", "open the Cabinet", "pick up the Cloth", "close the Cabinet",
        "find a Drawer", "open the Drawer", "put down the object in hand", "close the Drawer",
    ]  # fmt: skip
    # A put right after a pickup or a slice goes to its receptacle (ThorConnector drops the
    # object when the last skill was no find): pick_and_place_with_movable_recep-AppleSliced-Pan-CounterTop-8.
    movable = _plan(
        ("GotoLocation", ["stoveburner"]), ("PickupObject", ["pan"]), ("GotoLocation", ["countertop"]),
        ("PutObject", ["pan", "countertop"]), ("PickupObject", ["apple"]), ("PutObject", ["apple", "pan"]),
        ("GotoLocation", ["knife"]), ("PickupObject", ["knife"]), ("GotoLocation", ["apple"]),
        ("SliceObject", ["apple"]), ("PutObject", ["knife", "countertop"]), ("NoOp", []),
    )  # fmt: skip
    assert skills_from_high_pddl(movable) == [
        "find a Pan", "pick up the Pan", "find a CounterTop", "put down the object in hand", "pick up the Apple",
        "find a Pan", "put down the object in hand", "find a Knife", "pick up the Knife", "find a Apple",
        "slice the Apple", "find a CounterTop", "put down the object in hand",
    ]  # fmt: skip
