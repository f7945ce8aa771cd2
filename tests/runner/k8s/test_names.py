"""Job names and rollout label values: deterministic, valid DNS-1123 / label values, and distinct per id."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agl_lite.runner.k8s.names import job_name, rollout_label_value

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
rollout_ids = st.from_regex(r"\A[A-Za-z0-9_-]{1,128}\Z")


def test_a_short_lower_case_id_is_used_verbatim() -> None:
    assert job_name("ro-0123abcd") == "agl-ro-0123abcd"


@pytest.mark.parametrize("rollout_id", ["Ro-1", "ro_1", "-ro", "x" * 60, "__", "A" * 128])
def test_an_id_that_does_not_fit_gets_a_clean_prefix_and_a_hash(rollout_id: str) -> None:
    name = job_name(rollout_id)
    assert DNS_LABEL.match(name), name
    assert len(name) <= 63
    assert name.startswith("agl-")
    assert name != "agl-" + rollout_id


def test_ids_differing_only_in_case_or_underscores_get_different_names() -> None:
    names = {job_name(i) for i in ("ro-1", "RO-1", "ro_1", "Ro-1")}
    assert len(names) == 4


@given(rollout_ids)
def test_every_rollout_id_maps_to_a_valid_job_name(rollout_id: str) -> None:
    name = job_name(rollout_id)
    assert DNS_LABEL.match(name), name
    assert len(name) <= 63
    assert job_name(rollout_id) == name


@given(rollout_ids)
def test_every_rollout_id_maps_to_a_valid_label_value(rollout_id: str) -> None:
    value = rollout_label_value(rollout_id)
    assert LABEL_VALUE.match(value), value
    assert 1 <= len(value) <= 63


def test_a_valid_label_value_is_kept_as_is() -> None:
    assert rollout_label_value("Ro_1-x") == "Ro_1-x"
    assert rollout_label_value("_x") != "_x"
