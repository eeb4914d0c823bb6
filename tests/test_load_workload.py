import json
import os

import numpy as np
import pytest

from latlab.load.workload.datasets import DatasetError
from latlab.load.workload.requests import Workload
from latlab.records.lengths import LengthDistribution, WorkloadError
from latlab.records.workload import WorkloadConfig
from latlab.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(None)


def lengths(text: str) -> LengthDistribution:
    return LengthDistribution.parse(text, "--prompt-tokens")


def test_synthetic_prompts_have_exact_token_counts(tokenizer):
    w = Workload(WorkloadConfig(prompt_tokens=lengths("uniform:1,600"), seed=3))
    for i in range(60):
        s = w.request(i)
        assert len(tokenizer.encode(s.prompt)) == s.prompt_tokens
        assert 1 <= s.prompt_tokens <= 600 and s.max_tokens >= 1 and s.messages is None


def test_requests_are_reproducible_and_varied(tokenizer):
    config = WorkloadConfig(prompt_tokens=lengths("fixed:64"), seed=1)
    a, b = Workload(config), Workload(config)
    assert a.request(5) == b.request(5)
    firsts = {tuple(tokenizer.encode(a.request(i).prompt)[:4]) for i in range(50)}
    assert len(firsts) == 50  # no accidental shared prefix for a cache to find
    other = Workload(WorkloadConfig(prompt_tokens=lengths("fixed:64"), seed=2))
    assert other.request(5).prompt != a.request(5).prompt


def test_shared_prefix_for_a_fraction(tokenizer):
    w = Workload(WorkloadConfig(prompt_tokens=lengths("fixed:20"), prefix_tokens=30,
                                prefix_fraction=0.3, seed=0))
    specs = [w.request(i) for i in range(400)]
    shared = [s for s in specs if s.prompt_tokens == 50]
    assert {s.prompt_tokens for s in specs} == {20, 50}
    assert 0.22 < len(shared) / len(specs) < 0.38
    prefixes = {tuple(tokenizer.encode(s.prompt)[:30]) for s in shared}
    assert len(prefixes) == 1
    assert all(len(tokenizer.encode(s.prompt)) == s.prompt_tokens for s in specs[:40])


def test_chat_messages_and_system_prefix():
    w = Workload(WorkloadConfig(api="chat", prompt_tokens=lengths("fixed:10"), prefix_tokens=5))
    s = w.request(0)
    assert s.prompt is None
    assert [m["role"] for m in s.messages] == ["system", "user"]
    assert s.prompt_tokens == 15


@pytest.mark.parametrize("text,mean,std", [("fixed:100", 100, 0),
                                           ("uniform:50,150", 100, 100 / 12 ** 0.5),
                                           ("normal:300,40", 300, 40),
                                           ("lognormal:200,100", 200, 100)])
def test_length_distributions(text, mean, std):
    d = lengths(text)
    rng = np.random.default_rng(0)
    samples = np.array([d.sample(rng) for _ in range(20000)])
    assert samples.min() >= 1
    assert samples.mean() == pytest.approx(mean, rel=0.02)
    assert samples.std() == pytest.approx(std, rel=0.05, abs=0.5)
    assert str(d) == text


def test_a_bare_number_is_fixed():
    assert lengths("128") == LengthDistribution(kind="fixed", a=128)


@pytest.mark.parametrize("text,fragment", [("zipf:3", "unknown distribution 'zipf'"),
                                           ("uniform:5", "expected uniform:LOW,HIGH"),
                                           ("uniform:9,3", "HIGH must be at least LOW"),
                                           ("fixed:-4", "must be positive"),
                                           ("normal:a,b", "expected normal:MEAN,STD")])
def test_bad_distributions_name_the_option(text, fragment):
    with pytest.raises(WorkloadError) as e:
        lengths(text)
    assert "--prompt-tokens" in str(e.value) and fragment in str(e.value)


def test_labels_drawn_by_weight():
    w = Workload(WorkloadConfig(tenants={"big": 3, "small": 1}, priorities={0: 1, 5: 1}))
    specs = [w.request(i) for i in range(800)]
    big = sum(s.tenant == "big" for s in specs) / len(specs)
    assert 0.68 < big < 0.82
    assert {s.priority for s in specs} == {0, 5}


def test_jsonl_dataset(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "the quick brown fox", "output_tokens": 7, "tenant": "a", "priority": 1},
            {"messages": [{"role": "user", "content": "hello"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    w = Workload(WorkloadConfig(dataset=path, output_tokens=lengths("fixed:33")))
    first, second, third = w.request(0), w.request(1), w.request(2)
    assert first.prompt == "the quick brown fox" and first.max_tokens == 7
    assert first.tenant == "a" and first.priority == 1
    assert first.prompt_tokens == len(tokenizer.encode("the quick brown fox"))
    assert "hello" in second.prompt and second.max_tokens == 33  # templated for completions
    assert third.prompt == first.prompt  # the dataset cycles
    chat = Workload(WorkloadConfig(api="chat", dataset=path))
    assert chat.request(1).messages == rows[1]["messages"]
    assert chat.request(0).messages == [{"role": "user", "content": "the quick brown fox"}]


def test_sharegpt_dataset(tmp_path, tokenizer):
    path = tmp_path / "sharegpt.json"
    reply = "a reply of several tokens indeed"
    path.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "question one"},
                           {"from": "gpt", "value": reply}]},
        {"conversations": [{"from": "human", "value": "lonely"}]},
    ]))
    w = Workload(WorkloadConfig(dataset=path))
    s = w.request(0)
    assert s.prompt == "question one"
    assert s.max_tokens == len(tokenizer.encode(reply))
    assert w.request(1).prompt == "question one"  # the one-turn conversation is skipped


@pytest.mark.parametrize("content,fragment", [
    ('{"prompt": "ok"}\nnot json\n', "line 2: not JSON"),
    ('{"text": "x"}\n', "line 1: needs a string `prompt`"),
    ('{"prompt": "x", "output_tokens": 0}\n', "line 1: output_tokens must be a positive"),
    ("", "no usable requests"),
])
def test_bad_datasets_are_rejected_by_line(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError) as e:
        Workload(WorkloadConfig(dataset=path))
    assert "--dataset" in str(e.value) and fragment in str(e.value)


def test_unreadable_dataset(tmp_path):
    path = tmp_path / "secret.jsonl"
    path.write_text('{"prompt": "x"}\n')
    os.chmod(path, 0)
    if os.access(path, os.R_OK):  # root reads anything
        path = tmp_path / "missing.jsonl"
    with pytest.raises(DatasetError, match="--dataset .*cannot read it"):
        Workload(WorkloadConfig(dataset=path))


def test_bad_tokenizer_names_the_option(tmp_path):
    with pytest.raises(WorkloadError, match="--tokenizer"):
        Workload(WorkloadConfig(tokenizer=str(tmp_path)))


def test_a_salt_changes_every_prompts_words_but_not_the_lengths():
    base = WorkloadConfig(prompt_tokens=LengthDistribution(kind="uniform", a=8, b=64),
                          prefix_tokens=16, prefix_fraction=0.5, seed=3)
    plain, salted, other = (Workload(base.model_copy(update={"prompt_salt": salt}))
                            for salt in (None, 11, 12))
    for i in range(20):
        a, b, c = plain.request(i), salted.request(i), other.request(i)
        assert a.prompt_tokens == b.prompt_tokens == c.prompt_tokens
        assert a.max_tokens == b.max_tokens and len(plain.tokenizer.encode(b.prompt)) == (
            b.prompt_tokens)
        assert len({a.prompt, b.prompt, c.prompt}) == 3
    assert Workload(base).request(5).prompt == plain.request(5).prompt  # unsalted: the seed's
