"""The endpoint picker's parts on hand-made replica states: each scorer's formula, the prefix index, the config."""

from __future__ import annotations

import json

import pytest

from spyre_lab.serving.router.config import POLICIES, build_profile, load_config
from spyre_lab.serving.router.prefix_index import PrefixIndex, block_hashes
from spyre_lab.serving.router.scheduler import (
    KVCacheUtilizationScorer,
    LoadAwareScorer,
    NoReplicaError,
    QueueScorer,
    Replica,
    RoutingRequest,
)


def _replicas(*waiting: float, kv: tuple[float, ...] = ()) -> list[Replica]:
    return [Replica(f"http://r{i}", waiting=w, kv_usage=kv[i] if kv else 0.0) for i, w in enumerate(waiting)]


def test_queue_scorer_is_min_max_of_the_waiting_queue():
    request = RoutingRequest("m", "x")
    assert QueueScorer().score(request, _replicas(0, 5, 10)) == {"http://r0": 1.0, "http://r1": 0.5, "http://r2": 0.0}
    assert set(QueueScorer().score(request, _replicas(3, 3)).values()) == {1.0}


def test_kv_and_load_aware_scorers_follow_llm_d():
    request = RoutingRequest("m", "x")
    assert KVCacheUtilizationScorer().score(request, _replicas(0, 0, kv=(0.25, 1.0))) == {"http://r0": 0.75,
                                                                                         "http://r1": 0.0}
    scores = LoadAwareScorer(threshold=10).score(request, _replicas(0, 5, 50))
    assert scores == {"http://r0": 0.5, "http://r1": 0.25, "http://r2": 0.0}


def test_block_hashes_chain_and_are_seeded_by_the_model():
    text = "a" * 16 + "b" * 16 + "c" * 5
    hashes = block_hashes(text, "m", 16, 256)
    assert len(hashes) == 2  # the partial third block is not hashed
    assert block_hashes("z" + text[1:], "m", 16, 256)[1] != hashes[1]  # block 1's hash covers block 0
    assert block_hashes(text, "other-model", 16, 256)[0] != hashes[0]
    assert block_hashes(text, "m", 16, 1) == hashes[:1]


def test_prefix_index_matches_from_the_start_and_evicts_least_recent():
    index = PrefixIndex(block_size=4, lru_capacity=3)
    first = index.hashes("aaaabbbbcccc", "m")
    index.add("r0", first)
    assert index.matched_blocks("r0", first) == 3 and index.matched_blocks("r1", first) == 0
    assert index.matched_blocks("r0", index.hashes("aaaabbbbdddd", "m")) == 2
    assert index.matched_blocks("r0", index.hashes("xaaabbbbcccc", "m")) == 0  # a chain breaks at its first miss
    index.add("r0", index.hashes("zzzz", "m"))
    assert index.size("r0") == 3 and index.matched_blocks("r0", first) == 0  # block 0 was the least recent


def test_the_prefix_aware_profile_sticks_to_the_replica_that_has_the_prefix():
    profile = build_profile(POLICIES["prefix-aware"], seed=0)
    replicas = _replicas(0, 0, 0)
    prompt = "system 3: " + "q" * 60
    first = profile.schedule(RoutingRequest("m", prompt + " count from 1 to 7:"), replicas).chosen
    for tail in (" count from 4 to 9:", " 3 + 4 =", " letters from a to f:"):
        decision = profile.schedule(RoutingRequest("m", prompt + tail), replicas)
        assert decision.chosen is first
        assert decision.scores["prefix-cache-scorer"][first.url] > 0.5
    # totals are 2 * queue + 2 * kv + 3 * prefix: the longest queue alone (queue score 0) still loses to a full
    # prefix match (0 + 2 + 3 = 5 against 2 + 2 + 0 = 4); a nearly full KV cache as well tips it (0 + 0.2 + 3)
    first.waiting = 8
    assert profile.schedule(RoutingRequest("m", prompt + " 2 + 2 ="), replicas).chosen is first
    first.kv_usage = 0.9
    assert profile.schedule(RoutingRequest("m", prompt + " 5 + 3 ="), replicas).chosen is not first


def test_ties_are_broken_at_random_and_round_robin_cycles():
    replicas = _replicas(0, 0, 0)
    chosen = {build_profile(POLICIES["least-queue"], seed=s).schedule(RoutingRequest("m", "x"), replicas).chosen.url
              for s in range(12)}
    assert len(chosen) > 1
    rr = build_profile(POLICIES["round-robin"])
    assert [rr.schedule(RoutingRequest("m", "x"), replicas).chosen.url for _ in range(4)] == [
        "http://r0", "http://r1", "http://r2", "http://r0"]


def test_unhealthy_replicas_are_filtered_and_none_left_is_an_error():
    replicas = _replicas(0, 0)
    replicas[0].healthy = False
    profile = build_profile(POLICIES["round-robin"])
    assert {profile.schedule(RoutingRequest("m", "x"), replicas).chosen.url for _ in range(3)} == {"http://r1"}
    replicas[1].healthy, replicas[1].last_error = False, "ConnectError"
    with pytest.raises(NoReplicaError, match="ConnectError"):
        profile.schedule(RoutingRequest("m", "x"), replicas)


def test_a_yaml_endpoint_picker_config_sets_plugins_and_weights(tmp_path):
    path = tmp_path / "epp.yaml"
    path.write_text("""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: load-aware-scorer
  parameters: {threshold: 4}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 0
  - pluginRef: load-aware-scorer
    weight: 5
  - pluginRef: max-score-picker
""")
    profile = build_profile(load_config(path), seed=0)
    assert [(p.name, w) for p, w in profile.scorers] == [("queue-scorer", 0.0), ("load-aware-scorer", 5.0)]
    decision = profile.schedule(RoutingRequest("m", "x"), _replicas(2, 0))
    assert decision.chosen.url == "http://r1" and decision.totals == {"http://r0": 1.25, "http://r1": 2.5}
    (tmp_path / "p.json").write_text(json.dumps(POLICIES["round-robin"]))
    assert build_profile(load_config(tmp_path / "p.json")).picker.name == "round-robin-picker"


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.update(kind="Other"), "kind must be"),
    (lambda c: c["plugins"].append({"type": "magic-scorer"}), "unknown plugin type 'magic-scorer'"),
    (lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "nope"}), "refers to 'nope'"),
    (lambda c: c["schedulingProfiles"][0]["plugins"][1].update(weight=-1), "weight of 'queue-scorer'"),
    (lambda c: next(p for p in c["plugins"] if p["type"] == "prefix-cache-scorer").update(
        parameters={"hashBlocksize": 4}), r"prefix-cache-scorer.*hashBlocksize"),     # a misspelt parameter
])
def test_a_bad_config_names_what_is_wrong(change, message):
    config = json.loads(json.dumps(POLICIES["prefix-aware"]))
    change(config)
    with pytest.raises(ValueError, match=message):
        build_profile(config)
    with pytest.raises(ValueError, match="neither a policy"):
        load_config("no-such-policy")
