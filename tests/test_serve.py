"""The HTTP server (``jaxpipe.serve``) through the official ``openai`` client and httpx, on a real uvicorn.

Most tests share the session's ``server`` fixture (tests/conftest.py: a batched engine of the bundled cards
the routes serve); those that need another budget or mode start a small server of their own on one card.
Every request uses 2 denoising steps (or the few more a test needs to catch a job mid-run).
"""

import base64
import concurrent.futures
import io
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from PIL import Image  # noqa: E402

import jaxpipe as jp  # noqa: E402
from jaxpipe.engine import Engine  # noqa: E402
from jaxpipe.serve import media  # noqa: E402
from jaxpipe.serve.app import create_app  # noqa: E402
from jaxpipe.serve.front import MIN_REQUEST_BYTES, STATE_COPIES, Budget, Front, estimate_bytes  # noqa: E402
from jaxpipe.serve.server import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the client marks videos.* so

STEPS = {"num_steps": 2}


def client(url: str) -> "openai.OpenAI":
    # no retries: a 429 / 503 must reach the test, not be retried by the client
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def png(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return np.asarray(image)


def first_frame_png(engine: Engine) -> bytes:
    """A conditioning image for wan-i2v: a flux-t2i rendering, as the PNG a user would upload."""
    out = engine.run(jp.Request("flux-t2i", "seven thick", seed=5, num_steps=2))
    return media.encode_png(out["image"])


def error(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}, body
    return body["error"]


# ---- models, health, metrics ---------------------------------------------------------------------------------


def test_models_list_every_served_id_with_kind_loops_and_what_it_makes(server):
    models = {m.id: m for m in client(server.url).models.list().data}
    assert set(models) == set(server.front.engine.models())
    assert all(m.object == "model" and m.owned_by == "jaxpipe" for m in models.values())
    flux, wf, i2v = models["flux-t2i"], models["image_video.t2i_i2v"], models["wan-i2v"]
    assert (flux.kind, flux.makes, flux.loops) == ("card", "image", ["t2i_denoise"])
    assert (i2v.kind, i2v.makes) == ("card", "video")
    assert (wf.kind, wf.makes, wf.loops) == ("workflow", "video", ["t2i/t2i_denoise", "i2v/i2v_denoise"])
    assert models["digit-scorer"].makes == "scores" and models["bagel-mot"].makes == "image"
    assert httpx.get(server.url + "/v1/models/flux-t2i").json()["id"] == "flux-t2i"


def test_health_and_metrics(server):
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    client(server.url).images.generate(model="flux-t2i", prompt="two", extra_body=STEPS)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "jaxpipe_queue_depth",
        "jaxpipe_running_rows",
        "jaxpipe_request_latency_seconds_bucket",
        "jaxpipe_engine_ticks_total",
        "jaxpipe_steps_per_second",
        "jaxpipe_admissions_refused_total",
        "jaxpipe_requests_total",
    ):
        assert name in text, name
    assert 'jaxpipe_requests_total{model="flux-t2i",status="completed"}' in text
    assert 'jaxpipe_request_latency_seconds_count{endpoint="images",model="flux-t2i"}' in text


def _refused_total(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("jaxpipe_admissions_refused_total{")
    )


def test_every_refused_request_is_counted_in_metrics(server):
    before = _refused_total(server)
    bad = [
        ("/v1/images/generations", b"{not json"),
        ("/v1/images/generations", {"model": "no-such-model", "prompt": "two"}),
        ("/v1/images/generations", {"model": "flux-t2i", "prompt": "two", "size": "huge"}),
        ("/v1/images/generations", {"model": "flux-t2i", "prompt": "two", "n": 0}),
        ("/v1/images/generations", {"model": "flux-t2i"}),
        ("/v1/images/generations", {"model": "flux-t2i", "prompt": "a cat"}),
        ("/v1/images/generations", {"model": "flux-t2i", "prompt": " "}),
        ("/v1/chat/completions", {"model": "unified", "messages": []}),
        ("/v1/rewards", {"model": "digit-scorer", "images": [], "prompts": ["two"]}),
    ]
    for route, body in bad:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = httpx.post(server.url + route, timeout=60, **kwargs)
        assert 400 <= response.status_code < 500, (route, body, response.text)
    assert _refused_total(server) - before == len(bad)


# ---- images --------------------------------------------------------------------------------------------------


def test_images_generate_b64_and_url(server):
    api = client(server.url)
    result = api.images.generate(
        model="flux-t2i",
        prompt="seven thick",
        n=2,
        size="16x16",
        response_format="b64_json",
        extra_body={"seed": 11, **STEPS},
    )
    images = [png(base64.b64decode(d.b64_json)) for d in result.data]
    assert len(images) == 2 and all(im.shape == (16, 16) for im in images)
    assert not np.array_equal(images[0], images[1])  # seeds 11 and 12
    by_url = api.images.generate(
        model="flux-t2i", prompt="seven thick", response_format="url", extra_body={"seed": 11, **STEPS}
    )
    fetched = httpx.get(by_url.data[0].url)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert png(fetched.content).shape == (16, 16)
    assert httpx.get(server.url + "/v1/files/file-nope/content").status_code == 404


def test_a_bad_request_among_good_concurrent_ones_leaves_them_correct(server):
    url = server.url + "/v1/images/generations"
    good = [{"model": "flux-t2i", "prompt": "three thin", "seed": s, **STEPS} for s in range(3)]
    bad = [
        {"model": "flux-t2i", "prompt": "three thn", **STEPS},
        {"model": "flux-t2i", "prompt": "three", "num_steps": 0},
    ]
    with concurrent.futures.ThreadPoolExecutor(len(good) + len(bad)) as pool:
        answers = list(
            pool.map(lambda body: httpx.post(url, json=body, timeout=120), [good[0], bad[0], good[1], bad[1], good[2]])
        )
    assert [a.status_code for a in answers] == [200, 400, 200, 400, 200]
    engine = server.front.engine
    for answer, body in zip([answers[0], answers[2], answers[4]], good):
        served = png(base64.b64decode(answer.json()["data"][0]["b64_json"])).astype(int)
        offline = png(
            media.encode_png(engine.run(jp.Request("flux-t2i", "three thin", seed=body["seed"], num_steps=2))["image"])
        )
        # batched serving agrees with one-at-a-time within the C3 tolerance: at most one 8-bit level apart
        assert np.abs(served - offline.astype(int)).max() <= 1


# ---- video jobs ------------------------------------------------------------------------------------------------


def test_video_job_create_retrieve_download(server):
    api = client(server.url)
    upload = first_frame_png(server.front.engine)
    job = api.videos.create(
        model="wan-i2v",
        prompt="seven moving right",
        input_reference=("seven.png", upload, "image/png"),
        extra_body={"seed": 3, **STEPS},
    )
    assert job.object == "video" and job.status in ("queued", "in_progress") and job.size == "16x16"
    deadline = time.monotonic() + 120
    while job.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
        job = api.videos.retrieve(job.id)
    assert job.status == "completed" and job.progress == 100 and job.error is None
    gif = Image.open(io.BytesIO(api.videos.download_content(job.id).content))
    assert gif.format == "GIF" and gif.n_frames == 8 and gif.size == (16, 16)
    thumbnail = httpx.get(f"{server.url}/v1/videos/{job.id}/content", params={"variant": "thumbnail"})
    assert png(thumbnail.content).shape == (16, 16)


def test_a_workflow_video_job_by_json_and_delete_cancels_it(server):
    api = client(server.url)
    done = api.videos.create_and_poll(model="image_video.t2i_i2v", prompt="four moving up", extra_body=STEPS)
    assert done.status == "completed" and done.progress == 100
    # 64 steps per stage (the batched loops' shortest schedule width, so no new compile) outlast the DELETE below
    # (~0.3 s against a few ms); a machine too busy for that gets two more tries
    for _ in range(3):
        job = httpx.post(
            server.url + "/v1/videos", json={"model": "image_video.t2i_i2v", "prompt": "four", "num_steps": 64}
        ).json()
        deleted = api.videos.delete(job["id"])
        assert deleted.deleted and deleted.id == job["id"]
        after = api.videos.retrieve(job["id"])
        if after.status != "completed":
            break
    assert after.status == "cancelled" and after.progress < 100 and after.error.code == "cancelled"
    refused = httpx.get(f"{server.url}/v1/videos/{job['id']}/content")
    assert refused.status_code == 409 and error(refused)["code"] == "video_not_ready"


# ---- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        ({"prompt": "sevn thick"}, 400, "prompt", ["'sevn'", "did you mean 'seven'"]),
        ({"prompt": "seven", "num_steps": 0}, 400, "num_steps", ["num_steps", "greater than or equal to 1"]),
        ({"prompt": "seven", "num_steps": 5000}, 400, "num_steps", ["num_steps", "less than or equal to 1000"]),
        ({"prompt": "seven", "response_format": "png"}, 400, "response_format", ["'b64_json' or 'url'"]),
        ({"prompt": "seven", "size": "64x64"}, 400, "size", ["'16x16'"]),
        ({"prompt": "seven", "n": 0}, 400, "n", ["n", "greater than or equal to 1"]),
        ({}, 400, "prompt", ["prompt", "Field required"]),
        ({"model": "nope", "prompt": "seven"}, 404, "model", ["'nope'", "flux-t2i", "image_video.t2i_i2v"]),
        ({"model": "wan-i2v", "prompt": "seven"}, 400, "model", ["POST /v1/videos"]),
    ],
)
def test_bad_image_bodies_get_their_status_and_a_message_naming_the_problem(server, body, status, param, words):
    answer = httpx.post(server.url + "/v1/images/generations", json={"model": "flux-t2i", **body})
    assert answer.status_code == status, answer.text
    err = error(answer)
    assert err["param"] == param and all(w in err["message"] for w in words), err


def test_non_finite_guidance_is_refused(server):
    for value in ("NaN", "Infinity"):
        answer = httpx.post(
            server.url + "/v1/images/generations",
            headers={"content-type": "application/json"},
            content=f'{{"model": "flux-t2i", "prompt": "seven", "guidance": {value}}}',
        )
        assert answer.status_code == 400 and error(answer)["param"] == "guidance"
        assert "finite" in error(answer)["message"]


def test_video_errors(server):
    url = server.url + "/v1/videos"
    for job_url in (f"{url}/video_nope", f"{url}/video_nope/content"):
        answer = httpx.get(job_url)
        assert answer.status_code == 404 and error(answer)["code"] == "video_not_found"
    assert httpx.delete(f"{url}/video_nope").status_code == 404
    no_image = httpx.post(url, json={"model": "wan-i2v", "prompt": "seven"})
    assert no_image.status_code == 400 and "image" in error(no_image)["message"]
    not_base64 = httpx.post(url, json={"model": "wan-i2v", "prompt": "seven", "image": "not base64!"})
    assert not_base64.status_code == 400 and error(not_base64)["param"] == "image"
    image_model = httpx.post(url, json={"model": "flux-t2i", "prompt": "seven"})
    assert image_model.status_code == 400 and "/v1/images/generations" in error(image_model)["message"]
    unknown = httpx.post(url, json={"model": "sora-2", "prompt": "seven"})
    assert unknown.status_code == 404 and "wan-i2v" in error(unknown)["message"]
    assert httpx.post(url, content=b"{", headers={"content-type": "application/json"}).status_code == 400
    seconds = httpx.post(url, json={"model": "image_video.t2i_i2v", "prompt": "seven", "seconds": "4"})
    assert seconds.status_code == 400 and error(seconds)["param"] == "seconds" and "'1'" in error(seconds)["message"]
    with pytest.raises(openai.NotFoundError):
        client(server.url).videos.retrieve("video_nope")


# ---- a small server of its own: the budget, draining, bit-for-bit serial serving ----------------------------------


def _engine(mode: str) -> Engine:
    engine = Engine(mode=mode)
    engine.register(jp.cards.load("flux-t2i"))
    return engine


def test_budget_refuses_what_never_fits_at_once_busy_with_retry_after_and_draining():
    one = estimate_bytes(_engine("batched"), "flux-t2i")
    assert one == max(MIN_REQUEST_BYTES, STATE_COPIES * 4 * 8 * 8 * 4)
    front = Front(_engine("batched"), Budget(max_rows=2, max_queued=0, max_memory_bytes=int(1.5 * one)))
    with serve_in_thread(create_app(front)) as url:
        url_images = url + "/v1/images/generations"
        body = {"model": "flux-t2i", "prompt": "one", **STEPS}
        too_many = httpx.post(url_images, json={**body, "n": 3})
        assert too_many.status_code == 400 and "max_rows=2" in error(too_many)["message"]
        too_big = httpx.post(url_images, json={**body, "n": 2})
        assert too_big.status_code == 413 and "max_memory_bytes" in error(too_big)["message"]
        for _ in range(3):  # the held request runs ~0.1 s; a machine too busy to ask within it gets two more tries
            held = front.submit(jp.Request("flux-t2i", "one", num_steps=64))
            busy = httpx.post(url_images, json=body)
            assert held.result(60)["image"].shape == (16, 16, 1)  # the admitted one is not disturbed
            if busy.status_code != 200:
                break
        assert busy.status_code == 429 and error(busy)["code"] == "busy", busy.text
        assert int(busy.headers["Retry-After"]) >= 1 and "retry in about" in error(busy)["message"]
        assert front.drain(10.0)
        draining = httpx.post(url_images, json=body)
        assert draining.status_code == 503 and error(draining)["code"] == "draining"
        assert httpx.get(url + "/health").json()["status"] == "draining"
        refused = httpx.get(url + "/metrics").text
        assert 'jaxpipe_admissions_refused_total{reason="memory"} 1.0' in refused
    front.close()


def test_served_images_equal_offline_rendering_bit_for_bit_when_serial():
    engine = _engine("serial")
    with Front(engine) as front, serve_in_thread(create_app(front)) as url:
        result = client(url).images.generate(
            model="flux-t2i", prompt="eight bright", n=2, extra_body={"seed": 7, **STEPS}
        )
        served = [base64.b64decode(d.b64_json) for d in result.data]
        exact = client(url).images.generate(
            model="flux-t2i", prompt="eight bright", n=2, extra_body={"seed": 7, "output_format": "npy", **STEPS}
        )
        floats = [np.load(io.BytesIO(base64.b64decode(d.b64_json))) for d in exact.data]
    for seed, data, array in zip((7, 8), served, floats):
        offline = engine.run(jp.Request("flux-t2i", "eight bright", seed=seed, num_steps=2))["image"]
        assert data == media.encode_png(offline)
        assert array.dtype == np.float32 and np.array_equal(array, np.asarray(offline))  # C1 through HTTP, every bit


def test_the_wait_window_lets_requests_arriving_together_start_in_one_batch():
    with Front(_engine("batched"), Budget(max_wait_ms=500)) as front:
        first = front.submit(jp.Request("flux-t2i", "six", seed=0, num_steps=2))
        time.sleep(0.02)
        second = front.submit(jp.Request("flux-t2i", "six", seed=1, num_steps=2))
        started = [next(e.tick for e in h.events() if e.kind == "started") for h in (first, second)]
        assert started[0] == started[1] and second.result(60) is not None


class _FlakyEngine(Engine):
    """An engine whose first tick raises before doing anything (a fault the front must survive)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.faults = 1

    def tick(self) -> bool:
        if self.faults:
            self.faults -= 1
            raise RuntimeError("injected tick fault")
        return super().tick()


def test_a_failing_tick_does_not_stop_the_front():
    engine = _FlakyEngine(mode="batched")
    engine.register(jp.cards.load("flux-t2i"))
    with Front(engine) as front:
        handle = front.submit(jp.Request("flux-t2i", "five", num_steps=2))
        assert handle.result(timeout=120)["image"].shape == (16, 16, 1) and engine.faults == 0
        assert front.drain(1.0)


def test_budget_rejects_bad_limits():
    for bad in ({"max_rows": 0}, {"max_queued": -1}, {"max_memory_bytes": 0}, {"max_wait_ms": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Budget(**bad)


def test_the_app_never_changes_the_engine_it_is_given():
    from jaxpipe.serve.chat import register_text_programs

    engine = Engine()
    engine.register(jp.cards.load("bagel-mot"))
    with Front(engine) as front:
        create_app(front)
        assert engine.models() == ["bagel-mot"]  # its image-reading program is not served behind the caller's back
    assert register_text_programs(engine) == ["bagel-mot:understand"]  # whoever builds the engine serves it
    assert engine.models() == ["bagel-mot", "bagel-mot:understand"]
