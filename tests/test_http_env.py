"""`http_env`: an environment behind a server on 127.0.0.1 (rlvr's shape and OpenEnv's), run
through the episode loop; a failing or slow server scores its episodes 0 without a hang."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks.http_env import HTTPEnv, HTTPEnvError, http_env
from tests.helpers import ScriptedEngine

TOKENIZER = build_char_tokenizer()


class Game(BaseHTTPRequestHandler):
    """Guess the row's number: "higher"/"lower" until it is found. `mode` (class-wide) makes
    the server fail: "500", "slow" or "garbage"."""

    sessions: dict[str, int] = {}
    mode = "ok"
    last: dict = {}

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if Game.mode == "500":
            self.send_error(500, "boom")
            return
        if Game.mode == "slow":
            time.sleep(3)
        if self.path == "/reset":
            if "row" in body:  # rlvr's shape
                episode = uuid.uuid4().hex
                Game.sessions[episode] = int(body["row"]["answer"])
                answer = {
                    "messages": [{"role": "user", "content": "guess\n"}],
                    "episode_id": episode,
                }
            else:  # OpenEnv's
                Game.last = {"target": int(body["answer"])}
                answer = {"observation": {"text": "guess\n"}, "reward": None, "done": False}
        elif self.path == "/step":
            if "reply" in body:
                target, guess = Game.sessions[body["episode_id"]], int(body["reply"])
                done = guess == target
                word = "correct" if done else ("higher" if guess < target else "lower")
                answer = {
                    "messages": [] if done else [{"role": "user", "content": f"{word}\n"}],
                    "reward": 1.0 if done else None,
                    "done": done,
                }
            else:
                guess = int(body["action"]["message"])
                done = guess == Game.last["target"]
                answer = {"observation": {"text": "no\n"}, "reward": float(done), "done": done}
        else:
            answer = {}
        data = b"not json" if Game.mode == "garbage" else json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Game)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Game.mode = "ok"
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def play(factory, replies, group_size=2, step_timeout_s=5.0):
    return run_episodes(
        ScriptedEngine(TOKENIZER, replies),
        PlainTurns(TOKENIZER),
        factory,
        [{"prompt": "", "answer": 5}],
        [0],
        group_size,
        EpisodeLimits(
            max_turns=4, max_tokens=100, max_reply_tokens=8, step_timeout_s=step_timeout_s
        ),
        1.0,
        torch.Generator().manual_seed(0),
        TOKENIZER.decode,
        TOKENIZER.eos_token_id,
    )


def test_episodes_against_a_server(server):
    for e in play(http_env(server), ["3", "9", "5"]):
        assert e.status == "done" and e.episode_return(1.0) == 1.0
        assert TOKENIZER.decode(e.prompt_ids) == "guess\n"
        assert (
            TOKENIZER.decode(e.ids) == "3<|endoftext|>higher\n9<|endoftext|>lower\n5<|endoftext|>"
        )


def test_openenv_shape(server):
    (e,) = play(http_env(server, openenv=True, observation_field="text"), ["2", "5"], 1)
    assert e.status == "done" and e.episode_return(1.0) == 1.0
    assert TOKENIZER.decode(e.ids) == "2<|endoftext|>no\n5<|endoftext|>"


@pytest.mark.parametrize("mode, message", [("500", "HTTP 500"), ("garbage", "not JSON")])
def test_a_failing_server_is_an_episode_error(server, mode, message):
    Game.mode = mode
    for e in play(http_env(server), ["5"]):
        assert e.status == "error" and message in e.info["error"] and e.episode_return(1) == 0


def test_a_slow_server_times_out_without_holding_the_batch(server):
    Game.mode = "slow"
    start = time.monotonic()
    episodes = play(http_env(server), ["5"], step_timeout_s=0.3)
    assert time.monotonic() - start < 2.5
    assert all(e.status == "timeout" for e in episodes)


def test_a_refused_connection_names_the_url():
    env = HTTPEnv("http://127.0.0.1:9", timeout_s=1)
    with pytest.raises(HTTPEnvError, match="POST http://127.0.0.1:9/reset"):
        env.reset({}, seed=0)
