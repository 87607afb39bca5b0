"""EB-ALFRED's skill list (issue 30 item 4): EmbodiedBench's global list and per-scene
instance skills as ``EBAlfEnv`` builds them (b247936), and the scene-filtered list the
paper's prompt shows (appendix E.4)."""

from __future__ import annotations

import pytest

from memprism_ray.benchmark.ebalfred import skills as sk

#: (action id, name) pairs that EmbodiedBench's own in-context examples use
#: (embodiedbench/evaluator/config/alfred_examples.json, b247936): ids of the global list.
UPSTREAM_EXAMPLE_IDS = [
    (2, "find a Faucet"), (7, "find a Pan"), (18, "find a DiningTable"), (22, "find a Apple"),
    (39, "find a CounterTop"), (48, "find a Cabinet"), (57, "find a AlarmClock"), (63, "find a DeskLamp"),
    (79, "find a Sink"), (86, "pick up the Pan"), (98, "pick up the AlarmClock"), (130, "pick up the ButterKnife"),
    (133, "put down the object in hand"), (139, "open the Fridge"), (146, "close the Cabinet"),
    (151, "turn on the DeskLamp"), (156, "turn off the Faucet"), (161, "slice the Bread"),
]  # fmt: skip


def _obj(kind: str, k: int, receptacle: bool = False, pickupable: bool = False) -> dict:
    return {"objectType": kind, "objectId": f"{kind}|{k}|0|0", "receptacle": receptacle, "pickupable": pickupable}


#: A kitchen as AI2-THOR's metadata lists it: three cabinets, two mugs, one of the rest.
SCENE = [
    _obj("Cabinet", 1, receptacle=True),
    _obj("Mug", 1, pickupable=True),
    _obj("Cabinet", 2, receptacle=True),
    _obj("CounterTop", 1, receptacle=True),
    _obj("Cabinet", 3, receptacle=True),
    _obj("Mug", 2, pickupable=True),
    _obj("GlassBottle", 1, pickupable=True),
    _obj("Faucet", 1),
    _obj("Faucet", 2),  # neither receptacle nor pickable: no instance skills (upstream)
]


def test_global_list_is_embodiedbench_s_162_in_order() -> None:
    g = sk.global_skills()
    assert len(g) == 162 and len(set(g)) == 162
    assert all(g[i] == name for i, name in UPSTREAM_EXAMPLE_IDS)


def test_scene_extras_are_generate_additional_action_space() -> None:
    """Instances 2.. of receptacle/pickable types: find (and open/close for openable
    receptacles), receptacles first, each group sorted."""
    assert sk.scene_extra_skills(SCENE) == [
        "find a Cabinet_2",
        "find a Cabinet_3",
        "open the Cabinet_2",
        "close the Cabinet_2",
        "open the Cabinet_3",
        "close the Cabinet_3",
        "find a Mug_2",
    ]
    full = sk.language_skill_set(SCENE)
    assert len(full) == 169 and full[:162] == sk.global_skills()


def test_scene_filter_keeps_what_the_scene_can_do() -> None:
    """Upstream order kept; an instance name counts as its type; names match objectId
    prefixes case-folded (upstream's 'Glassbottle' is AI2-THOR's 'GlassBottle')."""
    assert sk.scene_filter(sk.language_skill_set(SCENE), SCENE) == [
        "find a Faucet", "find a Mug", "find a Glassbottle", "find a CounterTop", "find a Cabinet",
        "pick up the Mug", "pick up the Glassbottle",
        sk.PUT_DOWN, sk.DROP,
        "open the Cabinet", "close the Cabinet",
        "turn on the Faucet", "turn off the Faucet",
        "find a Cabinet_2", "find a Cabinet_3", "open the Cabinet_2", "close the Cabinet_2",
        "open the Cabinet_3", "close the Cabinet_3", "find a Mug_2",
    ]  # fmt: skip


def test_skill_strings_and_modes() -> None:
    assert sk.is_skill_string("find a Mug") and sk.is_skill_string("drop the object in hand")
    assert not sk.is_skill_string("look") and not sk.is_skill_string("I will find a Mug")
    assert sk.skill_object("open the Cabinet_2") == "Cabinet_2" and sk.skill_object(sk.PUT_DOWN) is None
    with pytest.raises(ValueError, match=r"ebalfred\.skills='all'"):
        sk.check_mode("all")


def test_instance_names_are_ebalfenv_s_id_to_name_dict() -> None:
    """Issue 41 item 1: ``generate_additional_action_space`` numbers the instances of a type with
    two or more in the order of the scene's objects: the first keeps the bare name (``EBAlfEnv.step``
    maps it to that objectId), the k-th is ``Type_k``; receptacles and non-receptacle pickables are
    two tables; a type of one instance, or of neither kind (Faucet), gets no name."""
    assert sk.instance_names(SCENE) == {
        "Cabinet|1|0|0": "Cabinet", "Cabinet|2|0|0": "Cabinet_2", "Cabinet|3|0|0": "Cabinet_3",
        "Mug|1|0|0": "Mug", "Mug|2|0|0": "Mug_2",
    }  # fmt: skip
    reordered = [SCENE[4], *SCENE[:4], *SCENE[5:]]  # the third cabinet listed first
    assert sk.instance_names(reordered)["Cabinet|3|0|0"] == "Cabinet"
    assert sk.instance_names(reordered)["Cabinet|2|0|0"] == "Cabinet_3"


def test_upstream_ids_number_embodiedbench_s_full_list() -> None:
    """Issue 41 item 4: the ids EmbodiedBench's planner gives each skill are positions in the full
    list (the 162 global skills, then the scene's instance skills); the scene-filtered list keeps
    every instance skill, so its ids follow from it alone."""
    full = sk.language_skill_set(SCENE)
    shown = sk.scene_filter(full, SCENE)
    assert [full[i] for i in sk.upstream_ids(shown)] == shown
    assert sk.upstream_ids(full) == list(range(len(full))) and sk.full_list_size(shown) == len(full) == 169
    assert sk.upstream_ids(["find a Cabinet", "find a Cabinet_2"]) == [48, 162]
    # A basin's instance names come from its objectType (SinkBasin), its id starts with Sink.
    basins = [{"objectType": "SinkBasin", "objectId": f"Sink|{k}|0|0|SinkBasin", "receptacle": True} for k in (1, 2)]
    full = sk.language_skill_set(basins)
    assert full[162:] == ["find a SinkBasin_2"] and sk.scene_filter(full, basins)[-1] == "find a SinkBasin_2"
