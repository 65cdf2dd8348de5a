"""YAML syntax errors at the line that holds the mistake, in our words (issue 38, item 12):
PyYAML named the line after an unclosed bracket or quote, in its parser's vocabulary
("did not find expected ',' or ']'"). Each case breaks the repository's matrix.yaml the
way people do, with libyaml and with the pure-Python parser (their words differ)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.spec import yamlpos

ROOT = Path(__file__).resolve().parents[2]
MATRIX = (ROOT / "matrix.yaml").read_text()
# PyYAML's own vocabulary, which says nothing about what to change
PARSER_WORDS = ("did not find expected", "could not find expected", "while parsing",
                "while scanning", "mapping values are not allowed", "<block end>",
                "cannot start any token", "end of stream")

# (name, text replaced, replacement, the line of the mistake: a line of the replacement)
CASES = [
    ("unclosed-list", "      host: 127.0.0.1\n", "      host: [127.0.0.1\n", "host: [127",
     "'[' here is not closed"),
    ("unclosed-mapping", "    expect_backends: {attention: CPU_ATTN, speculative: ngram}\n",
     "    expect_backends: {attention: CPU_ATTN, speculative: ngram\n", "expect_backends: {"
     "attention: CPU_ATTN, speculative: ngram\n", "'{' here is not closed"),
    ("unclosed-quote", '      VLLM_CPU_KVCACHE_SPACE: "1"\n', '      VLLM_CPU_KVCACHE_SPACE: "1\n',
     'VLLM_CPU_KVCACHE_SPACE: "1', "the quote opened here is"),
    ("key-without-colon", "  namespace: vllm-spark\n", "  namespace vllm-spark\n",
     "namespace vllm-spark", "':' after its key is missing"),
    ("indented-too-deep", "  namespace: vllm-spark\n", "  namespace: vllm-spark\n   bad: 1\n",
     "   bad: 1", "indented deeper"),
    ("dedented-key", "      enforce-eager: true\n", "     enforce-eager: true\n",
     "     enforce-eager: true", "indentation matches no mapping"),
    ("tab", "  namespace: vllm-spark\n", "\tnamespace: vllm-spark\n", "\tnamespace",
     "a tab indents this line"),
    ("text-after-quote", '      VLLM_CPU_KVCACHE_SPACE: "1"\n',
     '      VLLM_CPU_KVCACHE_SPACE: "1" GiB\n', '"1" GiB', "unexpected 'G' after the value"),
    ("reserved-first-character", "      tool-call-parser: hermes\n",
     "      tool-call-parser: @hermes\n", "@hermes", "cannot start with '@'"),
    ("bad-escape", "      tool-call-parser: hermes\n", '      tool-call-parser: "\\hermes"\n',
     "hermes", "'\\h' is no escape"),
]


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("loader", ["libyaml", "python"])
@pytest.mark.parametrize("name,old,new,mistake,said", CASES, ids=[c[0] for c in CASES])
def test_the_mistake_is_named_at_its_line(name, old, new, mistake, said, loader, tmp_path,
                                          monkeypatch) -> None:
    if loader == "libyaml" and not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML without libyaml")
    monkeypatch.setattr(yamlpos, "_LOADER", yaml.CSafeLoader if loader == "libyaml"
                        else yaml.SafeLoader)
    assert old in MATRIX, name
    text = MATRIX.replace(old, new, 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        yamlpos.load_located(path, "matrix.yaml")
    err = caught.value
    assert err.where is not None and err.where.startswith(
        f"matrix.yaml:{_line_of(text, mistake)}:"), (err.where, err.message)
    assert said in err.message, err.message
    assert err.fix and "fix the YAML syntax at that position" not in err.fix
    assert not any(w in err.message for w in PARSER_WORDS), err.message


def test_check_says_it_and_exits_2(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "matrix.yaml"
    text = MATRIX.replace("      host: 127.0.0.1\n", "      host: [127.0.0.1\n", 1)
    path.write_text(text)
    assert main(["check", "--matrix", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    first = out.err.splitlines()[0]
    assert first.startswith(f"error: {path}:{_line_of(text, 'host: [')}:"), first
    assert "  fix: close it with ']'" in out.err
