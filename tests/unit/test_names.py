"""Names, subjects, labels and selectors: table tests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.errors import InvalidStreamConfig
from jetstream.protocol import names as n


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("orders", True),
        ("Orders_2024-eu", True),
        ("a", True),
        ("x" * 64, True),
        ("", False),
        ("x" * 65, False),
        ("has space", False),
        ("dot.ted", False),
        ("star*", False),
        ("ünïcode", False),
        ("tab\t", False),
        ("trailing\n", False),
        (None, False),
        (5, False),
    ],
)
def test_stream_and_group_names(name: object, ok: bool) -> None:
    assert n.is_stream_name(name) is ok
    assert n.is_group_name(name) is ok
    if ok:
        assert n.check_stream_name(name) == name
    else:
        with pytest.raises(InvalidStreamConfig) as caught:
            n.check_group_name(name)
        assert caught.value.code == "INVALID_STREAM_CONFIG"
        assert caught.value.fields == {"field": "group"}


@pytest.mark.parametrize(
    ("subject", "ok", "literal"),
    [
        ("orders", True, True),
        ("shop.orders.eu", True, True),
        ("shop.*.eu", True, False),
        ("shop.>", True, False),
        (">", True, False),
        ("*", True, False),
        ("*.*.>", True, False),
        ("_INBOX.abc123", True, True),
        ("a-b_c.$d", True, True),
        ("x" * 255, True, True),
        ("x" * 256, False, False),
        ("", False, False),
        (".orders", False, False),
        ("orders.", False, False),
        ("shop..orders", False, False),
        ("shop.>.eu", False, False),
        ("shop.or*ders", False, False),
        ("shop.orders>", False, False),
        ("shop.**", False, False),
        ("shop orders", False, False),
        ("shop.\torders", False, False),
        ("shop.\u00a0", False, False),
        ("shop.\x00", False, False),
        ("shop\r\n", False, False),
        (None, False, False),
    ],
)
def test_subjects(subject: object, ok: bool, literal: bool) -> None:
    assert n.is_subject(subject) is ok
    assert n.is_subject(subject, wildcards=False) is literal
    if not ok:
        with pytest.raises(InvalidStreamConfig) as caught:
            n.check_subject(subject, "config.subject")
        assert caught.value.fields == {"field": "config.subject"}


@pytest.mark.parametrize(
    ("subject", "partition", "expected"),
    [
        ("orders", 0, "orders"),
        ("orders", 1, "orders.1"),
        ("shop.*", 12, "shop.*.12"),
        ("shop.>", 0, "shop.>"),
        (">", 0, ">"),
    ],
)
def test_partition_subject(subject: str, partition: int, expected: str) -> None:
    assert n.partition_subject(subject, partition) == expected


@pytest.mark.parametrize(
    ("subject", "partition"),
    [("shop.>", 1), (">", 2), ("orders", -1), ("orders", True), ("x" * 254, 10)],
)
def test_partition_subject_refuses(subject: str, partition: int) -> None:
    with pytest.raises(InvalidStreamConfig):
        n.partition_subject(subject, partition)


def test_partitioned_subjects() -> None:
    n.check_partitioned_subject("shop.>", 1)
    n.check_partitioned_subject("shop.*", 4)
    with pytest.raises(InvalidStreamConfig) as caught:
        n.check_partitioned_subject("shop.>", 2)
    assert caught.value.fields == {"field": "subject"}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("a", True),
        ("app", True),
        ("prod-eu_1.b", True),
        ("A9", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("", False),
        ("-a", False),
        ("a-", False),
        ("a.", False),
        ("_a", False),
        ("a b", False),
        ("a/b", False),
        ("é", False),
    ],
)
def test_labels(text: str, ok: bool) -> None:
    assert n.is_label(text) is ok
    if ok:
        assert n.check_labels({text: text}) == {text: text}
    else:
        for labels in ({text: "v"}, {"k": text}):
            with pytest.raises(InvalidStreamConfig):
                n.check_labels(labels)


def test_label_limits() -> None:
    n.check_labels({f"k{i}": "v" for i in range(n.LABELS_MAX)})
    with pytest.raises(InvalidStreamConfig):
        n.check_labels({f"k{i}": "v" for i in range(n.LABELS_MAX + 1)})
    with pytest.raises(InvalidStreamConfig):
        n.check_labels([("k", "v")])


SHOP_PROD = {"app": "shop", "env": "prod", "tier": "web"}
SHOP_DB = {"app": "shop", "env": "stage", "tier": "db"}
LEGACY = {"app": "shop", "env": "prod", "legacy": "yes"}
BARE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", [SHOP_PROD, SHOP_DB, LEGACY, BARE]),
        ("app=shop", [SHOP_PROD, SHOP_DB, LEGACY]),
        ("app==shop", [SHOP_PROD, SHOP_DB, LEGACY]),
        ("app = shop", [SHOP_PROD, SHOP_DB, LEGACY]),
        ("app!=shop", [BARE]),  # != matches a missing key
        ("tier!=db", [SHOP_PROD, LEGACY, BARE]),
        ("env in (prod,stage)", [SHOP_PROD, SHOP_DB, LEGACY]),
        ("env in ( prod , stage )", [SHOP_PROD, SHOP_DB, LEGACY]),
        ("env in(prod)", [SHOP_PROD, LEGACY]),
        ("env notin (prod)", [SHOP_DB, BARE]),  # notin matches a missing key
        ("legacy", [LEGACY]),
        ("!legacy", [SHOP_PROD, SHOP_DB, BARE]),
        ("! legacy", [SHOP_PROD, SHOP_DB, BARE]),
        ("app=shop,env in (prod,stage),tier!=db,!legacy", [SHOP_PROD]),
        ("  app=shop , tier  ", [SHOP_PROD, SHOP_DB]),
        ("in=x", []),  # "in" is a key when it comes first
    ],
)
def test_selectors(selector: str, matches: list[dict[str, str]]) -> None:
    predicate = n.parse_selector(selector)
    everyone = [SHOP_PROD, SHOP_DB, LEGACY, BARE]
    assert [labels for labels in everyone if predicate(labels)] == matches
    # The canonical form parses to the same selector.
    assert n.parse_selector(str(predicate)) == predicate


@pytest.mark.parametrize(
    "selector",
    [
        "app=",
        "=shop",
        "app=shop=x",
        "app==",
        "app shop",
        "app in ()",
        "app in (a,)",
        "app in (a",
        "app in a",
        "app notin",
        "app,",
        ",app",
        "app,,tier",
        "!",
        "!app=shop",
        "!!app",
        "app=sh op",
        "app=shop;tier=db",
        "app=-shop",
        "a/b=c",
        "app=" + "x" * 64,
        "k in (" + ",".join(f"v{i}" for i in range(n.SELECTOR_VALUES_MAX + 1)) + ")",
        ",".join(f"k{i}" for i in range(n.SELECTOR_REQUIREMENTS_MAX + 1)),
        "k" * (n.SELECTOR_CHARS_MAX + 1),
    ],
)
def test_bad_selectors(selector: str) -> None:
    with pytest.raises(InvalidStreamConfig) as caught:
        n.parse_selector(selector, "consumer.selector")
    assert caught.value.fields == {"field": "consumer.selector"}


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_invalid_stream_config(text: str) -> None:
    try:
        predicate = n.parse_selector(text)
    except InvalidStreamConfig:
        return
    assert n.parse_selector(str(predicate)) == predicate
