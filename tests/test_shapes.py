"""The shapes world: renders, the prompt grammar and its held-out split, the analytic judge, its reward."""

import dataclasses
import itertools

import numpy as np
import pytest

from jaxpipe.shapes import grammar, judge_accuracy, rewards, scenes
from jaxpipe.shapes import judging as judge
from jaxpipe.shapes.grammar import CATEGORIES, HELDOUT_PAIRS, Prompt, Thing, parse
from jaxpipe.shapes.scenes import Obj, Scene, render, render_video
from jaxpipe.shapes.words import RELATIONS


def test_a_scene_renders_the_same_at_every_call_anti_aliased_at_any_size():
    scene = Scene((Obj("circle", "red", "big", 0.3, 0.4), Obj("triangle", "blue", "small", 0.75, 0.7)))
    image = render(scene)
    assert image.shape == (32, 32, 3) and image.dtype == np.float32 and 0 <= image.min() and image.max() <= 1
    np.testing.assert_array_equal(image, render(scene))
    background, red = np.asarray(scenes.BACKGROUND, np.float32), np.asarray(scenes.PALETTE[0], np.float32)
    t = (image - background) @ (red - background) / ((red - background) @ (red - background))
    assert ((t > 0.05) & (t < 0.95)).sum() > 10  # blended edge pixels: anti-aliased
    assert render(scene, 64).shape == (64, 64, 3)
    video = render_video(Scene((Obj("square", "green", "small", 0.3, 0.5, "right"),)), frames=8)
    assert video.shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(video[0], render(Scene((Obj("square", "green", "small", 0.3, 0.5, "right"),))))
    with pytest.raises(ValueError, match="unknown colour 'pink'"):
        Obj("circle", "pink", "big", 0.5, 0.5)


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_category_reads_back_from_its_text(category):
    rng = np.random.default_rng(0)
    for _ in range(20):
        prompt = grammar.sample(category, rng)
        assert parse(prompt.text, category) == prompt
    assert parse("a big red circle").things == (Thing("red", "circle", "big"),)
    assert parse("a red circle moving right and a blue square still").category == "video"


@pytest.mark.parametrize(
    "text, message",
    [
        ("a red dog", "expected a colour .* then a shape"),
        ("five red circles", "expected 'a'"),
        ("three red circle", "COUNT COLOUR SHAPES"),
        ("a red circle left a blue square", "write 'left of'"),
        ("a red circle or a blue square", "unexpected word 'or'"),
        ("a red circle moving sideways", "'moving' takes one of"),
    ],
)
def test_a_prompt_outside_the_grammar_is_refused_naming_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_the_heldout_pairs_never_reach_training_and_every_heldout_prompt_names_one():
    captions = grammar.captioned_scenes(300, seed=1)
    for caption, scene in captions:
        assert not parse(caption).pairs & HELDOUT_PAIRS, caption
        assert not {(o.colour, o.shape) for o in scene.objects} & HELDOUT_PAIRS
    for category in CATEGORIES:
        train = grammar.prompt_set(category, 16)
        heldout = grammar.prompt_set(category, 16, split="heldout")
        one = category in ("single_object", "colors")  # one thing: as many prompts as pairs (12 seen, 6 held out)
        assert (len({p.text for p in train}), len({p.text for p in heldout})) == ((12, 6) if one else (16, 16))
        assert all(not p.pairs & HELDOUT_PAIRS for p in train) and all(p.pairs & HELDOUT_PAIRS for p in heldout)
        assert [p.text for p in train] == [p.text for p in grammar.prompt_set(category, 16)]  # the same test prompts
    attributes = grammar.prompt_set("color_attr", 16)
    assert all(a.colour != b.colour and a.shape != b.shape for a, b in (p.things for p in attributes))


@pytest.mark.parametrize("size", [32, 64])
def test_the_judge_is_right_on_fresh_renders_of_every_category(size):
    accuracy = judge_accuracy.measure(40 if size == 32 else 15, size=size, seed=11)
    assert min(accuracy.values()) >= 0.98, accuracy
    heldout = judge_accuracy.measure(20 if size == 32 else 8, size=size, split="heldout", seed=12)
    assert min(heldout.values()) >= 0.98, heldout


def test_the_judge_fails_what_is_wrong():
    rng = np.random.default_rng(0)
    right = Prompt("color_attr", (Thing("yellow", "square"), Thing("green", "triangle")))
    scene = grammar.scene_for(right, rng)
    swapped = Scene(
        tuple(Obj(o.shape, other.colour, o.size, o.x, o.y) for o, other in zip(scene.objects, scene.objects[::-1]))
    )
    assert judge.correct(judge.judge(render(scene), right), "color_attr")
    checks = judge.judge(render(swapped), right)
    assert not judge.correct(checks, "color_attr") and judge.correct(checks, "two_object")  # the distractor
    left = Prompt("position", right.things, "left")
    placed = Scene((Obj("square", "yellow", "small", 0.2, 0.5), Obj("triangle", "green", "small", 0.8, 0.5)))
    assert judge.correct(judge.judge(render(placed), left), "position")
    assert not judge.correct(judge.judge(render(placed), Prompt("position", right.things, "right")), "position")
    three = Prompt("counting", (Thing("red", "circle"),) * 3)
    assert not judge.correct(
        judge.judge(render(grammar.scene_for(three, rng)), Prompt("counting", (Thing("red", "circle"),) * 4)),
        "counting",
    )
    empty = np.zeros((32, 32, 3), np.float32)
    assert judge.judge(empty, three) == {"count": False, "shape": False, "colour": False}
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        judge.detect(np.zeros((32, 32)))


def test_geneval_s_rule_asks_at_least_the_named_objects_and_counts_exactly():
    """GenEval's verdict (evaluate_images.py) on renders: an extra object is wrong only under the strict rule,
    except when counting; the most confident object of a class carries the colour; positions by relative_position."""
    from jaxpipe.shapes.geneval_rule import geneval_correct, relations

    def verdicts(objects, prompt):
        image = render(Scene(tuple(objects)))
        found = judge.detect(image)
        return judge.correct(judge.checks_of(found, prompt), prompt.category), geneval_correct(found, prompt)

    circle = Obj("circle", "red", "small", 0.25, 0.3)
    extra = Obj("square", "blue", "small", 0.75, 0.7)
    one = Prompt("single_object", (Thing("red", "circle"),))
    assert verdicts([circle], one) == (True, True)
    assert verdicts([circle, extra], one) == (False, True)  # GenEval does not mind a second object
    assert verdicts([extra], one) == (False, False)
    colours = Prompt("colors", (Thing("green", "circle"),))
    assert verdicts([circle], colours) == (False, False)
    two = Prompt("counting", (Thing("red", "circle"),) * 2)
    second = Obj("circle", "red", "small", 0.75, 0.3)
    assert verdicts([circle, second], two) == (True, True)
    assert verdicts([circle, second, extra], two) == (False, True)  # other classes do not count
    third = Obj("circle", "red", "small", 0.5, 0.75)
    assert verdicts([circle, second, third], two) == (False, False)  # one more of the class: excluded
    left = Prompt("position", (Thing("red", "circle"), Thing("blue", "square")), "left")
    beside = Obj("square", "blue", "small", 0.75, 0.35)
    assert verdicts([circle, beside], left) == (True, True)
    assert verdicts([circle, beside], Prompt("position", left.things, "right")) == (False, False)
    assert verdicts([circle, beside], Prompt("position", left.things, "above")) == (False, False)
    diagonal = [Obj("circle", "red", "small", 0.25, 0.25), Obj("square", "blue", "small", 0.75, 0.65)]
    assert verdicts(diagonal, Prompt("position", left.things, "above")) == (False, True)  # GenEval: left of and above
    near = [judge.Detection("circle", c, "small", x, 0.5, 39.6, 1.0) for c, x in (("red", 0.5), ("blue", 0.53))]
    assert relations(*near) == set() and relations(near[0], dataclasses.replace(near[1], x=0.6)) == {
        "left of"
    }  # centres closer than 0.1 of the boxes: no relation to tell
    twin = Prompt("position", (Thing("red", "circle"), Thing("blue", "circle")), "left")  # one shape named twice
    assert verdicts([circle, Obj("circle", "blue", "small", 0.75, 0.35)], twin) == (True, True)


def test_flowgrpo_s_geneval_reward_gives_partial_credit_and_one_exactly_when_geneval_says_right():
    """The reward FlowGRPO trains on GenEval with: counting earns 1 - |N - N_ref| / N_ref; other prompts half
    for the named objects being there, half more when right by GenEval's rule."""
    from jaxpipe.shapes.geneval_rule import geneval_correct, geneval_score
    from jaxpipe.shapes.rewards import geneval_scores

    def scored(objects, prompt):
        found = judge.detect(render(Scene(tuple(objects))))
        return geneval_score(found, prompt), geneval_correct(found, prompt)

    circle, second = Obj("circle", "red", "small", 0.25, 0.3), Obj("circle", "red", "small", 0.75, 0.3)
    third = Obj("circle", "red", "small", 0.5, 0.75)
    two = Prompt("counting", (Thing("red", "circle"),) * 2)
    assert scored([circle, second], two) == (1.0, True)
    assert scored([circle], two) == (0.5, False) and scored([circle, second, third], two) == (0.5, False)
    square = Obj("square", "blue", "small", 0.75, 0.35)
    left = Prompt("position", (Thing("red", "circle"), Thing("blue", "square")), "left")
    assert scored([circle, square], left) == (1.0, True)
    assert scored([circle, square], Prompt("position", left.things, "right")) == (0.5, False)  # there, misplaced
    assert scored([circle], left) == (0.25, False)  # one of the two there
    colours = Prompt("color_attr", (Thing("red", "circle"), Thing("green", "square")))
    assert scored([circle, square], colours) == (0.5, False)  # both shapes, a colour wrong
    assert scored([circle, Obj("square", "green", "small", 0.75, 0.35)], colours) == (1.0, True)
    image = render(Scene((circle, second)))
    np.testing.assert_array_equal(geneval_scores(image[None], ["two red circles"]), [1.0])
    with pytest.raises(ValueError, match="2 pictures for 1 prompts"):
        geneval_scores(np.stack([image, image]), ["two red circles"])


def test_the_video_judge_reads_each_motion():
    prompt = parse("a red circle moving right and a blue square still")
    scene = grammar.scene_for(prompt, np.random.default_rng(3), frames=8)
    assert judge.judge_video(render_video(scene), prompt) == {
        "count": True,
        "shape": True,
        "colour": True,
        "motion": True,
    }
    backwards = render_video(scene)[::-1]
    assert not judge.judge_video(backwards, prompt)["motion"]
    with pytest.raises(ValueError, match="T >= 2"):
        judge.judge_video(render(scene)[None], prompt)


def test_the_judge_reward_is_the_fraction_of_checks_passed():
    rng = np.random.default_rng(5)
    prompts = [grammar.sample(c, rng) for c in CATEGORIES]
    images = np.stack([render(grammar.scene_for(p, rng)) for p in prompts])
    np.testing.assert_array_equal(rewards.judge_scores(images, [p.text for p in prompts]), np.ones(6, np.float32))
    wrong = rewards.judge_scores(images[::-1], [p.text for p in prompts])
    assert wrong.dtype == np.float32 and wrong.shape == (6,) and wrong.max() <= 1 and wrong.min() < 1
    np.testing.assert_allclose(wrong * 12, np.round(wrong * 12), atol=1e-5)  # fractions of 3 or 4 checks
    with pytest.raises(ValueError, match="6 pictures for 2 prompts"):
        rewards.judge_scores(images, ["a red circle"] * 2)


def test_every_layout_holds_its_relation_and_stays_apart():
    rng = np.random.default_rng(8)
    for relation, _ in itertools.product(RELATIONS, range(10)):
        prompt = Prompt("position", (Thing("red", "circle"), Thing("blue", "triangle")), relation)
        a, b = grammar.scene_for(prompt, rng).objects
        assert scenes.separated(a, b) and scenes.inside(a) and scenes.inside(b)
