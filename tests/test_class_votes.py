"""The class's vote on a chapter's question (ui/follow/class_votes.py): a vote counts as a choice the page shows, a
vote again counts who changed, per browser that voted both times; the link carries the counts and the moves, and a
malformed one is a link problem."""

import pytest

from ui.follow.class_votes import checked_vote, moves_from, moves_of, moves_text, vote_counts, vote_reveal
from ui.state.link import parse_query


def test_a_vote_is_one_of_the_choices_shown():
    assert [checked_vote(c, 3) for c in (0, 2)] == [0, 2]
    for forged in (3, -1, True, "1", 1.0, None):
        assert checked_vote(forged, 3) is None, forged


def test_votes_are_counted_per_choice_and_values_that_are_no_choice_are_left_out():
    assert vote_counts({1: 2, 0: 1, 7: 3}, 3) == (1, 2, 0)


def test_moves_count_the_browsers_that_voted_both_times():
    before = {"ann": "0", "bob": "1", "cai": "1", "dev": "2", "eve": "3"}
    after = {"ann": "1", "bob": "1", "cai": "2", "fay": "0", "eve": "0", "gus": "x"}
    # dev did not vote again, fay not before, eve's first vote is no choice of 3, gus sent no number
    assert moves_of(before, after, 3) == {(0, 1): 1, (1, 1): 1, (1, 2): 1}


def test_moves_travel_in_the_link_and_a_malformed_list_is_refused():
    moves = {(0, 1): 2, (1, 1): 5, (2, 0): 1}
    assert moves_from(moves_text(moves)) == moves and moves_from("") == {}
    for bad in ("0:1", "0:1:2,", "a:b:1", "10:1:1", "0:1:123456"):
        assert moves_from(bad) is None, bad
        _, problems = parse_query({"ask_moves": bad})
        assert [p.reason for p in problems] == ["bad_list"], bad
    _, problems = parse_query({"ask_kind": "poll"})
    assert [p.reason for p in problems] == ["unknown_choice"]


def test_the_reveal_says_how_many_chose_right_and_after_a_vote_again_how_many_changed():
    first = vote_reveal(1, 3, {1: 2, 0: 1}, None, {})
    assert (first.counts, first.before, first.sentence) == ((1, 2, 0), None, ("vote_right", {"k": 2, "n": 3}))
    assert vote_reveal(1, 3, {}, None, {}).sentence == ("vote_nobody", {})
    again = vote_reveal(1, 3, {1: 3, 2: 1}, {1: 2, 0: 1, 2: 1}, {(0, 1): 1, (1, 1): 2, (2, 2): 1, (3, 0): 4})
    assert again.before == (1, 2, 1) and again.changed == {(0, 1): 1}  # (3, 0): no choice of 3, left out
    assert again.sentence == ("vote_moved", {"k0": 2, "n0": 4, "k": 3, "n": 4, "changed": 1, "both": 4})


@pytest.mark.parametrize("moves, order", [({(0, 1): 1, (2, 1): 3, (1, 0): 3}, [(1, 0), (2, 1), (0, 1)])])
def test_changes_are_listed_the_most_taken_first(moves, order):
    assert list(vote_reveal(0, 3, {}, {}, moves).changed) == order
