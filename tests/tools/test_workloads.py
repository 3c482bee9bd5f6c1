"""Benchmark workloads W1–W11: schema, texts, token counts with the embedded tokenizer, W10 scaling."""

import json
from pathlib import Path

import pytest

from guild.errors import GuildError
from guild.workloads import TEXT_REF, Workload, WorkloadError, default_root, load_workloads

IDS = [f"W{i}" for i in range(1, 12)]


@pytest.fixture(scope="module")
def tok(dense_path):
    from guild.formats.gguf import GGUFFile
    from guild.text.tokenizer import Tokenizer

    return Tokenizer.from_metadata(GGUFFile(dense_path).metadata)


@pytest.fixture(scope="module")
def workloads():
    return {w.id: w for w in load_workloads()}


def test_all_load_and_validate(workloads):
    assert list(workloads) == IDS
    for w in workloads.values():
        assert w.turns and w.max_tokens >= 1 and w.source.strip() and w.description.strip()
        assert w.path is not None and w.path.name == f"{w.id}.yaml"
        w.sampling_params()
    assert {k for k, w in workloads.items() if w.speculation == "hostile"} == {"W7", "W8"}
    assert workloads["W9"].max_tokens == 64
    assert workloads["W10"].context_sizes == (512, 1024, 2048, 4096, 8192, 16384, 32768, 65472)
    assert all(not w.context_sizes for k, w in workloads.items() if k != "W10")
    assert {k for k, w in workloads.items() if w.json_schema} == {"W11"}
    assert json.loads(workloads["W11"].texts[workloads["W11"].json_schema])["type"] == "object"


def test_every_text_reference_resolves(workloads):
    texts_dir = default_root() / "texts"
    used = set()
    for w in workloads.values():
        refs = [n for t in w.turns for n in TEXT_REF.findall(t)] + list(w.corpus)
        for name in refs:
            assert (texts_dir / f"{name}.txt").is_file(), (w.id, name)
            used.add(name)
        for turn in w.render_turns():
            assert "{text:" not in turn
        for name, body in zip(w.corpus, w.corpus_texts(), strict=True):
            assert body == (texts_dir / f"{name}.txt").read_text(encoding="utf-8").rstrip()
    files = {p.stem for p in texts_dir.glob("*.txt")}
    assert files == used, f"unused texts: {files - used}"
    (long_doc,) = workloads["W10"].document_names()  # as long as a 65,472-token prompt needs, no longer
    for p in texts_dir.glob("*.txt"):
        assert p.stat().st_size <= (300 if p.stem == long_doc else 24) * 1024, p.name


def test_rag_documents_are_in_prompt_and_corpus(workloads):
    w = workloads["W4"]
    assert len(w.corpus) >= 2
    prompt = w.render_turns()[0]
    for body in w.corpus_texts():
        assert body in prompt


def test_multi_turn_has_several_turns_and_a_corpus(workloads):
    w = workloads["W5"]
    assert len(w.turns) >= 3
    assert w.corpus
    assert TEXT_REF.search(w.turns[0]) and not any(TEXT_REF.search(t) for t in w.turns[1:])


def test_selection_by_name():
    ws = load_workloads(["w10", "W1", "W1.yaml"])
    assert [w.id for w in ws] == ["W10", "W1"]
    with pytest.raises(GuildError, match=r"unknown workload 'W12'.*W1, W2, .*W11"):
        load_workloads(["W12"])


def test_w9_prompt_is_about_64_tokens(workloads, tok):
    w = workloads["W9"]
    assert 40 <= len(w.prompt_ids(tok)) <= 90  # as the model sees it: chat template included
    assert 40 <= len(tok.encode(w.render_turns()[0])) <= 90  # the user's message alone


def test_prompts_fit_the_embedded_context(workloads, tok):
    for w in workloads.values():
        for x in w.instances(tok, 8192):
            total = sum(len(tok.encode(t)) for t in x.render_turns()) + 64 + len(x.turns) * x.max_tokens
            assert total <= 8192, x.key


def test_w10_scaling_hits_each_size(workloads, tok):
    """Every size up to 65,472 tokens (the 16K and 32K ones are built here, not run: no timing)."""
    w = workloads["W10"]
    (doc,) = w.document_names()
    for n in w.context_sizes:
        s = w.scaled(tok, n)
        assert s.key == f"W10@{n}" and s.size == n
        got = len(s.prompt_ids(tok))
        assert 0.9 * n <= got <= 1.1 * n, (n, got)
        assert w.texts[doc].startswith(s.texts[doc])
        assert s.corpus_texts() == [s.texts[doc]]
        assert s.render_turns()[0].rstrip().endswith(w.render_turns()[0].rstrip()[-80:])  # question kept
    assert [x.key for x in w.instances(tok, 8192)] == ["W10@512", "W10@1024", "W10@2048", "W10@4096"]
    assert [x.key for x in w.instances(tok, 2048)] == ["W10@512", "W10@1024"]  # 2048 + 128 generated > 2048
    assert [x.key for x in w.instances(tok, 16384 + 128)][-2:] == ["W10@8192", "W10@16384"]
    # the long document begins with the chapter the question asks about: every size holds the answer
    assert all("clause header" in w.scaled(tok, n).texts[doc] for n in (512, 16384))
    with pytest.raises(GuildError, match="context_sizes"):
        workloads["W2"].scaled(tok, 512)


class CharTokenizer:
    """encode/decode only, one id per character."""

    def encode(self, s):
        return [ord(c) for c in s]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_scaling_with_a_minimal_tokenizer(workloads):
    w = workloads["W10"]
    s = w.scaled(CharTokenizer(), 3000)
    assert 2700 <= len(s.render_turns()[0]) <= 3000


GOOD = """\
id: W1
name: test
description: a test workload
source: written for the test
turns:
  - "Summarise:\\n\\n{text:doc}"
max_tokens: 16
corpus: [doc]
"""


def write(tmp_path: Path, body: str, name: str = "W1.yaml", doc: bool = True) -> Path:
    (tmp_path / "texts").mkdir(exist_ok=True)
    if doc:
        (tmp_path / "texts" / "doc.txt").write_text("Some document text.\n")
    (tmp_path / name).write_text(body)
    return tmp_path


def test_good_file_in_tmp(tmp_path):
    (w,) = load_workloads(["W1"], root=write(tmp_path, GOOD))
    assert w.render_turns() == ["Summarise:\n\nSome document text."]
    assert w.chat is True and w.speculation == "friendly" and w.sampling_params().greedy


@pytest.mark.parametrize(
    "body, field",
    [
        (GOOD + "colour: red\n", "colour"),
        (GOOD.replace("max_tokens: 16\n", ""), "max_tokens"),
        (GOOD.replace("max_tokens: 16", "max_tokens: many"), "max_tokens"),
        (GOOD.replace("max_tokens: 16", "max_tokens: 0"), "max_tokens"),
        (GOOD.replace('turns:\n  - "Summarise:\\n\\n{text:doc}"', "turns: []"), "turns"),
        (GOOD.replace('  - "Summarise:\\n\\n{text:doc}"', '  - ""'), "turns[0]"),
        (GOOD.replace("{text:doc}", "{text:nope}"), "turns[0]"),
        (GOOD.replace("corpus: [doc]", "corpus: [doc, missing]"), "corpus[1]"),
        (GOOD.replace("corpus: [doc]", "corpus: doc"), "corpus"),
        (GOOD + "sampling: {temprature: 0.5}\n", "sampling.temprature"),
        (GOOD + "sampling: {temperature: hot}\n", "sampling.temperature"),
        (GOOD + "sampling: {temperature: -1}\n", "sampling"),
        (GOOD + "speculation: maybe\n", "speculation"),
        (GOOD + "chat: sometimes\n", "chat"),
        (GOOD + "context_sizes: [1024, 512]\n", "context_sizes"),
        (GOOD + "context_sizes: [big]\n", "context_sizes[0]"),
        (GOOD.replace("id: W1", "id: W2"), "id"),
        (GOOD.replace("name: test", "name: [1, 2]"), "name"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path, body, field):
    root = write(tmp_path, body)
    with pytest.raises(WorkloadError) as e:
        load_workloads(["W1"], root=root)
    msg = str(e.value)
    assert "W1.yaml" in msg and f"field '{field}'" in msg, msg
    assert "\n" not in msg


def test_invalid_yaml_and_non_mapping(tmp_path):
    root = write(tmp_path, "id: W1\nturns: [unclosed\n")
    with pytest.raises(GuildError, match=r"W1\.yaml: invalid YAML"):
        load_workloads(["W1"], root=root)
    root = write(tmp_path, "- just\n- a list\n")
    with pytest.raises(GuildError, match=r"W1\.yaml: expected a mapping"):
        load_workloads(["W1"], root=root)


def test_missing_text_file_names_it(tmp_path):
    root = write(tmp_path, GOOD, doc=False)
    with pytest.raises(GuildError, match=r"W1\.yaml: field 'turns\[0\]': text 'doc' not found"):
        load_workloads(["W1"], root=root)


def test_direct_construction_is_validated():
    base = dict(id="X", name="x", description="d", source="s", turns=("hi",), max_tokens=8)
    w = Workload(**base)
    assert w.key == "X" and w.render_turns() == ["hi"] and hash(w) == hash(Workload(**base))
    for bad in (dict(turns="hi"), dict(max_tokens=True), dict(sampling={"top_k": 1.5}), dict(corpus=["x"])):
        with pytest.raises(GuildError):
            Workload(**{**base, **bad})
