"""The default image (runtime.image_profile = "default") is what OpenAI's hosted shell guide
promises: its own first example works verbatim, each language it lists compiles or runs a
program as the sandbox user with the network disabled, and the data and media tools a model
reaches for work on files the test makes."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir, run1

from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.settings import Settings

# The guide's own example (docs/reference/openai-shell-tool-guide.pt.txt), verbatim.
GUIDE_EXAMPLE = "ls -lah /mnt/data && python --version && node --version"

VERSIONS = {
    "java -version 2>&1": 'openjdk version "17.',
    "php --version": "PHP 8.2.",
    "ruby --version": "ruby 3.1.",
    "go version": "go version go1.23.",
    "python --version": "Python 3.11.",
    "pip --version": "python 3.11",
    "node --version": "v22.16.",
}

PROGRAMS = {
    "python": "printf 'print(6 * 7)\\n' > m.py && python m.py",
    "node": "printf 'console.log(6 * 7)\\n' > m.js && node m.js",
    "npm": "npm --version >/dev/null && npx --version >/dev/null && echo 42",
    "java": "printf 'class A { public static void main(String[] a) { System.out.println(42); } }'"
    " > A.java && javac A.java && java A",
    "php": "printf '<?php echo 6 * 7, PHP_EOL;\\n' > m.php && php m.php",
    "ruby": "printf 'puts 6 * 7\\n' > m.rb && ruby m.rb",
    "go": 'mkdir -p g && cd g && printf \'package main\\nimport "fmt"\\n'
    "func main() { fmt.Println(42) }\\n' > m.go && go build -o m m.go && ./m",
    "c": "printf '#include <stdio.h>\\nint main(void) { printf(\"42\\\\n\"); }\\n' > m.c"
    " && gcc -o m m.c && ./m",
}


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica, with a correct cross-reference table."""
    stream = f"BT /F1 24 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return out


@pytest.fixture(scope="module")
async def default() -> AsyncIterator[tuple[OciRuntime, str]]:
    state = make_state_dir("shellbox-default-")
    # No image_profile: the default one. ./scripts/test.sh built it; else this builds it.
    settings = Settings(state_dir=state, runtime={"image_dir": IMAGE_DIR})
    rt = create_runtime(settings)
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))  # no network: the default policy
    await rt.start(cid)
    yield rt, cid
    await rt.destroy(cid)
    remove_state_dir(state)


async def test_the_guides_first_example_works_verbatim(
    default: tuple[OciRuntime, str],
) -> None:
    rt, cid = default
    result = await run1(rt, cid, GUIDE_EXAMPLE)
    assert result.outcome.exit_code == 0, result
    assert "Python 3.11." in result.stdout and "\nv22.16." in result.stdout, result


@pytest.mark.parametrize("command", list(VERSIONS))
async def test_the_languages_are_the_versions_the_guide_lists(
    default: tuple[OciRuntime, str], command: str
) -> None:
    rt, cid = default
    result = await run1(rt, cid, command)
    assert result.outcome.exit_code == 0 and VERSIONS[command] in result.stdout, result


async def test_the_network_is_disabled(default: tuple[OciRuntime, str]) -> None:
    rt, cid = default
    probe = "python -c \"import socket; socket.create_connection(('192.0.2.1', 80), timeout=2)\""
    result = await run1(rt, cid, probe)
    assert result.outcome.exit_code != 0 and "unreachable" in result.stderr, result


@pytest.mark.parametrize("language", list(PROGRAMS))
async def test_each_language_builds_and_runs_a_program_offline(
    default: tuple[OciRuntime, str], language: str
) -> None:
    rt, cid = default
    command = f"mkdir -p {language} && cd {language} && {PROGRAMS[language]}"
    result = await run1(rt, cid, command, timeout_ms=120_000)
    assert (result.stdout, result.outcome.exit_code) == ("42\n", 0), result


async def test_the_python_data_libraries_import(default: tuple[OciRuntime, str]) -> None:
    rt, cid = default
    imports = "import numpy, pandas, matplotlib, scipy, PIL, openpyxl"
    command = f'python -c "{imports}" && python -c "import requests, sqlite3; print(42)"'
    result = await run1(rt, cid, command, timeout_ms=60_000)
    assert (result.stdout, result.outcome.exit_code) == ("42\n", 0), result


async def test_ffmpeg_converts_a_generated_clip(default: tuple[OciRuntime, str]) -> None:
    rt, cid = default
    result = await run1(
        rt,
        cid,
        "ffmpeg -loglevel error -f lavfi -i testsrc=duration=1:size=64x48:rate=10"
        " -pix_fmt yuv420p clip.mp4 && ffmpeg -loglevel error -i clip.mp4 clip.webm"
        " && ffprobe -v error -select_streams v:0 -count_frames"
        " -show_entries stream=codec_name,width,height,nb_read_frames -of csv=p=0 clip.webm",
        timeout_ms=120_000,
    )
    assert (result.stdout, result.outcome.exit_code) == ("vp9,64,48,10\n", 0), result


async def test_imagemagick_resizes_a_generated_image(default: tuple[OciRuntime, str]) -> None:
    rt, cid = default
    command = (
        "convert -size 100x80 xc:red big.png && convert big.png -resize 50% small.png"
        " && identify -format '%wx%h\\n' small.png"
    )
    result = await run1(rt, cid, command)
    assert (result.stdout, result.outcome.exit_code) == ("50x40\n", 0), result


async def test_pdftotext_reads_a_pdf(default: tuple[OciRuntime, str]) -> None:
    rt, cid = default
    pdf = base64.b64encode(tiny_pdf("Hello from shellbox")).decode()
    result = await run1(rt, cid, f"echo {pdf} | base64 -d > t.pdf && pdftotext t.pdf -")
    assert result.outcome.exit_code == 0 and "Hello from shellbox" in result.stdout, result
