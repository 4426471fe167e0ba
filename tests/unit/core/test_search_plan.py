"""The search's pure decisions (``domain.search``): candidates, rungs, promotions, schedules."""

from __future__ import annotations

import pytest

from bucketlearn.domain.recipe import Score
from bucketlearn.domain.search import (
    Candidate,
    Line,
    Verdict,
    auto_search,
    best_through,
    candidate_epochs,
    draw_candidates,
    projected_wall,
    promote,
    rungs,
    settle,
)
from bucketlearn.errors import ConfigError
from bucketlearn.options import (
    OFF,
    SEARCH_AUTO,
    JobOptions,
    option_text,
    parse_option,
    resolve_options,
)


def test_the_first_candidate_is_the_default_and_the_draw_is_the_seeds():
    drawn = draw_candidates(8, 5, 256, 0.002)
    assert drawn[0] == Candidate(0, 5, 0.002, 256)  # the job's own configuration and model
    assert drawn[0].shaped() == {} and "the default model" in drawn[0].describe()
    assert drawn == draw_candidates(8, 5, 256, 0.002)  # the same seed, the same candidates
    other = draw_candidates(8, 6, 256, 0.002)[1:]
    assert [(c.learning_rate, c.width, c.depth) for c in other] != [
        (c.learning_rate, c.width, c.depth) for c in drawn[1:]]
    assert [c.index for c in drawn] == list(range(8))
    assert len({c.seed for c in drawn}) == 8
    for c in drawn[1:]:
        assert 0.002 * 2**-1.5 <= c.learning_rate <= 0.002 * 2**1.5
        assert c.batch_size in (128, 256, 512)
        assert c.width in (128, 256, 512) and c.depth in (2, 3, 4)
        assert c.smoothing in (0.0, 0.1)
    assert Candidate.from_dict(drawn[3].to_dict()) == drawn[3]


def test_an_image_search_varies_only_the_rate_batch_and_seed():
    drawn = draw_candidates(6, 0, 128, 0.0014, image=True)
    assert {c.shaped() == {} for c in drawn} == {True}  # the CNN as it is
    assert len({(c.learning_rate, c.batch_size, c.seed) for c in drawn}) == 6
    assert " x " not in drawn[2].describe() and "smoothing" not in drawn[2].describe()


def test_a_numeric_target_draws_no_label_smoothing():
    drawn = draw_candidates(6, 0, 256, 0.002, regression=True)
    assert {c.smoothing for c in drawn} == {None}
    classes = draw_candidates(6, 0, 256, 0.002)
    # the same draws otherwise: the smoothing is drawn and left out
    assert [(c.learning_rate, c.width, c.encoding) for c in drawn] == [
        (c.learning_rate, c.width, c.encoding) for c in classes]


@pytest.mark.parametrize("count", [1, 65])
def test_a_count_out_of_range_is_refused(count):
    with pytest.raises(ValueError, match="expected 2 to 64 candidates"):
        draw_candidates(count, 0, 256, 0.002)


def test_rungs_keep_a_third_and_train_four_finalists_to_the_budget():
    plan = rungs(16, 27)
    assert [(r.count, r.epochs, r.keep) for r in plan] == [(16, 3, 6), (6, 9, 4), (4, 27, 4)]
    # each rung's candidates from the previous budget to their own: 16*3 + 6*6 + 4*18
    assert candidate_epochs(plan) == 48 + 36 + 72
    assert [(r.count, r.epochs, r.keep) for r in rungs(8, 27)] == [(8, 9, 4), (4, 27, 4)]
    assert [(r.count, r.epochs) for r in rungs(3, 10)] == [(3, 10)]
    assert [r.count for r in rungs(64, 20)] == [64, 22, 8, 4]
    assert [r.epochs for r in rungs(64, 20)] == [1, 3, 7, 20]
    assert [r.epochs for r in rungs(64, 2)] == [1, 1, 1, 2]  # at least one epoch


def test_promotion_depends_on_scores_alone_ties_to_the_lower_index():
    a = Score(3, 3, accuracy=0.9, loss=0.3)
    standing = {4: a, 1: a, 2: Score(3, 3, accuracy=0.9, loss=0.2),
                0: Score(2, 2, accuracy=0.8, loss=0.1), 3: None}
    assert promote(standing, 3) == [2, 1, 4]
    assert promote(dict(reversed(list(standing.items()))), 3) == [2, 1, 4]
    assert promote({0: None}, 1) == []
    # a numeric target: the lower RMSE first
    assert promote({0: Score(1, 1, rmse=2.0), 1: Score(1, 1, rmse=1.5)}, 1) == [1]


def test_the_best_score_through_an_epoch_is_the_first_of_equals():
    scores = [Score(1, 1, accuracy=0.5, loss=1.0), Score(2, 2, accuracy=0.7, loss=0.5),
              Score(3, 3, accuracy=0.7, loss=0.5), Score(4, 4, accuracy=0.9, loss=0.1)]
    assert best_through(scores, 3) == scores[1]
    assert best_through(scores, 4) == scores[3]
    assert best_through(scores, 0) is None


def test_the_projected_wall_waits_for_each_rung():
    # rung 0: 4 candidates of 3, 1, 2, 2 s on 2 learners: (3), (1, 2, 2) -> 5 s; rung 1: 4 s
    assert projected_wall([[3, 1, 2, 2], [4]], 2) == pytest.approx(5 + 4)
    assert projected_wall([[3, 1, 2, 2], [4]], 1) == pytest.approx(8 + 4)
    assert projected_wall([[3, 1, 2, 2], [4]], 8) == pytest.approx(3 + 4)


@pytest.mark.parametrize("raw,count", [("off", OFF), ("OFF", OFF), ("8", 8),
                                       (" 64 ", 64), ("2", 2), ("auto", SEARCH_AUTO),
                                       (" Auto", SEARCH_AUTO)])
def test_search_is_off_auto_or_a_count(raw, count):
    assert parse_option("search", raw, "command line") == count


def test_search_auto_is_written_and_read_back_as_auto():
    options = JobOptions(search=SEARCH_AUTO)
    assert option_text("search", SEARCH_AUTO) == "auto" and option_text("search", OFF) == "off"
    assert options.to_metadata()["search"] == "auto"
    assert resolve_options(options.to_metadata()).search == SEARCH_AUTO
    assert resolve_options(environ={"BUCKETLEARN_DEFAULT_SEARCH": "auto"}).search == SEARCH_AUTO


@pytest.mark.parametrize("rows,validates,count,says", [
    (344, True, 0, "off: 344 training rows, below 20,000"),
    (19_999, True, 0, "off: 19,999 training rows"),
    (20_000, True, 8, "8 candidates: 20,000 training rows"),
    (269_420, True, 8, "8 candidates: 269,420 training rows"),
    (269_420, False, 0, "off: no validation rows"),
])
def test_search_auto_searches_where_the_measured_search_paid(rows, validates, count, says):
    found, why = auto_search(rows, validates)
    assert found == count and why.startswith(says)


@pytest.mark.parametrize("raw", ["1", "65", "eight", "", "-3"])
def test_a_bad_search_names_what_was_expected(raw):
    with pytest.raises(ConfigError, match="'off' or a whole number from 2 to 64"):
        parse_option("search", raw, "command line")


def test_search_comes_from_metadata_or_the_deployment_default():
    assert resolve_options().search == OFF
    assert resolve_options(environ={"BUCKETLEARN_DEFAULT_SEARCH": "8"}).search == 8
    assert resolve_options({"search": "3"}, environ={"BUCKETLEARN_DEFAULT_SEARCH": "8"}
                           ).search == 3
    with pytest.raises(ConfigError, match="object metadata"):
        resolve_options({"search": "100"})


def _scores(*accuracies: float) -> tuple[Score, ...]:
    return tuple(Score(e, e, accuracy=a, loss=1 - a) for e, a in enumerate(accuracies, 1))


def test_a_rung_is_decided_once_every_score_at_its_epochs_is_in():
    plan = rungs(6, 9)  # 6 to 3 epochs, keep 4; 4 to 9 epochs
    lines = {0: Line(0, _scores(.5, .6, .7)), 1: Line(1, _scores(.5, .6)),
             2: Line(2, _scores(.4, .5, .9)), 3: Line(3, _scores(.8, .8, .8)),
             4: Line(4, _scores(.3, .3, .3)), 5: Line(5, _scores(.6, .6, .6))}
    assert settle(plan, lines) == []  # candidate 1 has no score at epoch 3 yet
    lines[1] = Line(1, _scores(.5, .6, .65))
    (first,) = settle(plan, lines)
    assert first == Verdict(0, (0, 1, 2, 3, 4, 5), (2, 3, 0, 1))


def test_lines_that_ran_ahead_or_stopped_early_decide_as_if_they_waited():
    plan = rungs(6, 9)
    waited = {i: Line(i, _scores(*([.5 + i / 100] * 3))) for i in range(6)}
    # candidate 5 ran on to epoch 7 and did well there; candidate 4 stopped at epoch 2;
    # candidate 3 diverged
    ahead = {**waited, 5: Line(5, _scores(.55, .55, .55, .99, .99, .99, .99)),
             4: Line(4, _scores(.54, .54), finished=True),
             3: Line(3, _scores(.53, .53), dropped_at=3)}
    assert settle(plan, waited)[0].kept == (5, 4, 3, 2)
    assert settle(plan, ahead)[0].kept == (5, 4, 2, 1)  # 3 dropped; 5 by its epoch-3 score
    # the last rung: once every finalist has finished, the finalists best first
    done = {**ahead, **{i: Line(i, _scores(*([.6 + i / 100] * 9)), finished=True)
                        for i in (5, 4, 2, 1)}}
    assert [v.kept for v in settle(plan, done)] == [(5, 4, 2, 1), (5, 4, 2, 1)]
    # a finalist that diverges after rung 0 keeps its standing at rung 0; it is no finalist
    diverged = {**done, 2: Line(2, _scores(.52, .52, .52, .52), dropped_at=5)}
    verdicts = settle(plan, diverged)
    assert verdicts[0].kept == (5, 4, 1, 2) and verdicts[1].kept == (5, 4, 1)


def test_the_verdicts_do_not_depend_on_the_order_scores_arrive_in():
    plan = rungs(6, 9)
    final = {i: Line(i, _scores(*[.5 + ((i * 7 + e) % 5) / 100 for e in range(9)]),
                     finished=True) for i in range(6)}
    # scores arriving line by line, in two interleavings: every decided rung as at the end
    for order in (range(6), reversed(range(6))):
        seen = {i: Line(i) for i in range(6)}
        for epoch in range(1, 10):
            for i in order:
                seen[i] = Line(i, final[i].scores[:epoch], finished=epoch == 9)
                partial = settle(plan, seen)
                assert partial == settle(plan, final)[:len(partial)]
    assert len(settle(plan, final)) == 2


def test_a_candidates_model_fields_reach_its_spec_and_back():
    import dataclasses

    from bucketlearn.ml.model import ModelSpec

    spec = ModelSpec("mlp", 3, 2, None, 0, 0.002, recipe=2)
    shaped = dataclasses.replace(spec, **Candidate(1, 1, 0.003, 128, 512, 4, 0.0, False).shaped())
    assert spec.to_dict() == dataclasses.replace(spec, **Candidate(0, 0, 0.002, 256).shaped()
                                                 ).to_dict()  # an unsearched job's document
    assert "width" not in spec.to_dict()
    assert shaped.to_dict()["width"] == 512 and shaped.to_dict()["encoding"] is False
    assert ModelSpec.from_dict(shaped.to_dict()) == shaped
