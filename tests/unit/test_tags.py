import datetime as dt

import pytest

from imagebuild.errors import UserError
from imagebuild.spec.tags import newest_first, parse_release_tag, parse_tag

ENGINES = {"dflashfix": "0.23.0", "pr41703": "0.23.0", "next": "0.24.0rc1"}


def test_short_tag_yields_release_tag():
    tag = parse_tag("2026-06-18-dflashfix", ENGINES)
    assert str(tag) == "2026-06-18-v0.23.0-dflashfix"
    assert tag.short == "2026-06-18-dflashfix"
    assert tag.date == dt.date(2026, 6, 18)


def test_full_tag_is_accepted_and_checked_against_engine_version():
    assert str(parse_tag("2026-06-11-v0.23.0-pr41703", ENGINES)) == "2026-06-11-v0.23.0-pr41703"
    with pytest.raises(UserError, match="names vLLM 0.22.0"):
        parse_tag("2026-06-11-v0.22.0-pr41703", ENGINES)


@pytest.mark.parametrize("bad", ["2026-02-30-dflashfix", "26-06-18-dflashfix",
                                 "2026-06-18-", "2026-06-18-Dflashfix", "2026-06-18-a b"])
def test_bad_tags_are_user_errors(bad):
    with pytest.raises(UserError) as info:
        parse_tag(bad, ENGINES)
    assert info.value.exit_code == 2


def test_order_is_date_then_version_then_name():
    tags = [parse_release_tag(t) for t in [
        "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix",
        "2026-06-18-v0.24.0rc1-next", "2026-06-18-v0.23.0-alpha", "2026-06-18-v0.9.0-zeta"]]
    assert [str(t) for t in newest_first(tags)] == [
        "2026-06-18-v0.24.0rc1-next", "2026-06-18-v0.23.0-dflashfix",
        "2026-06-18-v0.23.0-alpha", "2026-06-18-v0.9.0-zeta", "2026-06-11-v0.23.0-pr41703"]


def test_non_release_tags_are_not_parsed():
    assert parse_release_tag("latest") is None
    assert parse_release_tag("2026-06-18-dflashfix") is None
