"""Label and field selectors: the grammar the client sends and the matching the API server does."""

from __future__ import annotations

import pytest

from agl_fake_k8s.resources import JOBS, PODS
from agl_fake_k8s.selectors import FieldSelector, LabelSelector, SelectorError

LABELS = {"app": "agl", "tier": "b", "n": "5"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=agl", True),
        ("app==agl", True),
        ("app!=agl", False),
        ("missing!=x", True),
        ("tier in (a,b)", True),
        ("tier notin (a, b)", False),
        ("missing notin (a)", True),
        ("missing in (a)", False),
        ("app", True),
        ("!app", False),
        ("!missing", True),
        ("n>4,n<6", True),
        ("app=agl,tier=c", False),
        ("app.kubernetes.io/managed-by=agl-lite", False),
    ],
)
def test_label_selectors_match_like_kubernetes(selector: str, matches: bool) -> None:
    assert LabelSelector(selector).matches(LABELS) is matches


@pytest.mark.parametrize("selector", ["a in (", "=x", "a=b=c", "a,,b", "a in (x y)"])
def test_malformed_label_selectors_are_refused(selector: str) -> None:
    with pytest.raises(SelectorError, match="unable to parse requirement"):
        LabelSelector(selector)


def test_field_selectors_accept_only_the_resource_s_fields() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}}
    assert FieldSelector(PODS, "metadata.name=p,status.phase!=Failed").matches(pod)
    assert not FieldSelector(PODS, "metadata.namespace==other").matches(pod)
    assert FieldSelector(JOBS, "status.successful=0").matches({"metadata": {"name": "j"}, "status": {}})
    with pytest.raises(SelectorError, match=r"field label not supported: status\.phase"):
        FieldSelector(JOBS, "status.phase=Running")
