"""A training corpus that needs no download: text the machine already holds.

Chapter 6 trains a small target and a smaller draft model, and a draft only helps if
both have learned the same text. The book downloads nothing. Its corpus is the book's own
text (`repository_files`: the package's sources, the chapters and the tests, in sorted
order), frozen into the package (`SNAPSHOT`, read by `snapshot_files`): the same on every
machine, whatever is installed there, and the same for every recording of the same code,
whatever was committed since, so the same code trains the same models. (The other
corpus, `python_files`, the installed standard library and packages, is over 100 MB but
changes with every Python and package release.) Code is a good corpus for speculative
decoding: much of it is predictable (indentation, closing brackets, `self.`), so a small
draft guesses many tokens right.

`build` holds every 20th file out, trains a byte-level BPE tokenizer on (every
`tokenizer_every`-th file of) the rest and encodes both into one stream of token ids each,
files separated by `EOT`. Byte-level BPE reads any text: decoding the ids gives back the
exact source. BPE's training is deterministic: the same files give the same tokenizer.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import io
import os
import sysconfig
import tarfile
import time
from importlib import metadata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PACKAGES = ("torch", "transformers", "matplotlib", "numpy")
# The book's own text: the package, the chapters, the tests. Not book/_recorded (a
# recording would feed the next one) nor anything generated.
REPOSITORY_GLOBS = ("code/gpuinfer/**/*.py", "book/*.md", "tests/*.py")
# The repository's root, seen from this file: code/gpuinfer/model/corpus.py
REPOSITORY = Path(__file__).resolve().parents[3]
EOT = "<|endoftext|>"  # the special token put between files

# Folders that hold no source of their own: the packages installed under the standard
# library's folder are read as packages (or not at all), bytecode caches are not text.
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_ENCODE_CHUNK = 256  # files per encode_batch call: enough to keep every core busy


def _py_files_under(root: Path) -> list[Path]:
    """Every .py file below `root`, not descending into `_SKIPPED_DIRS`."""
    found = []
    for folder, dirnames, filenames in os.walk(root):
        # Pruning in place stops os.walk from entering site-packages (tens of thousands
        # of files) at all, rather than walking it and filtering afterwards.
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]
        found += [Path(folder, f) for f in filenames if f.endswith(".py")]
    return found


def package_dir(name: str) -> Path:
    """The folder of the installed package `name`; ValueError if it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # e.g. the parent of "a.b" is not installed
        spec = None
    if spec is None or spec.origin is None:
        raise ValueError(f"package {name!r} is not installed: pip install {name}, "
                         "or leave it out of the packages")
    return Path(spec.origin).parent


def python_files(packages: Sequence[str] = PACKAGES, *,
                 stdlib: bool = True) -> list[Path]:
    """Every .py file of the standard library (without its site-packages) and of each
    installed package in `packages`, resolved, deduplicated and sorted by path: the same
    list, in the same order, on every run of the same installation."""
    roots = [Path(sysconfig.get_paths()["stdlib"])] if stdlib else []
    roots += [package_dir(name) for name in packages]
    return sorted({path.resolve() for root in roots for path in _py_files_under(root)})


def repository_files(root: Path | str = REPOSITORY,
                     globs: Sequence[str] = REPOSITORY_GLOBS) -> list[Path]:
    """The files of the book's repository at `root` that match `globs` (relative to it):
    sorted by their path relative to `root`, so that every checkout, wherever it lies,
    lists the same files in the same order. Only files under `root` (a link that leads
    out of it is left out): nothing installed on the machine enters the corpus."""
    root = Path(root).resolve()
    if not (root / "book").is_dir() or not (root / "code" / "gpuinfer").is_dir():
        raise FileNotFoundError(f"{root} is not the book's repository (no book/ and "
                                "code/gpuinfer/ in it): pass the folder of a checkout, "
                                "or install the package in editable mode from one")
    found = {}
    for pattern in globs:
        for path in root.glob(pattern):
            real = path.resolve()
            if real.is_file() and "__pycache__" not in path.parts and \
                    real.is_relative_to(root):
                found[path.relative_to(root).as_posix()] = path
    if not found:
        raise FileNotFoundError(f"no file under {root} matches {', '.join(globs)}: "
                                "pass the folder of a checkout of the book")
    return [found[name] for name in sorted(found)]


# The corpus the chapters train on: the book's text (REPOSITORY_GLOBS) as it was when it was
# frozen into this file, so that every recording of the same code trains on the same text
# whatever the checkout holds by then (the live repository changes with every commit).
# Made by `python -m gpuinfer.model.corpus freeze`; its SHA-256 is checked on every read,
# and a new snapshot changes this module, which stales the chapters that train on it.
SNAPSHOT = Path(__file__).with_name("corpus_snapshot.tar.gz")
SNAPSHOT_SHA256 = "1e509b8732d95b80a4f20ff4cd954bbc51cef98252d41433cef715f8893915d8"


def freeze(root: Path | str = REPOSITORY, path: Path | str = SNAPSHOT) -> str:
    """Write `repository_files(root)` into the tarball `path`, byte for byte the same for
    the same files (sorted, no times or owners); its SHA-256."""
    root = Path(root).resolve()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in repository_files(root):
            data = file.read_bytes()
            info = tarfile.TarInfo(file.relative_to(root).as_posix())
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(packed)
    os.replace(tmp, path)
    return hashlib.sha256(packed).hexdigest()


@functools.cache
def snapshot_files() -> list[Path]:
    """The files of SNAPSHOT, unpacked into a scratch folder of this process, in
    `repository_files` order: the corpus Chapters 5 and 6 train on."""
    from gpuinfer.env import scratch_dir

    packed = SNAPSHOT.read_bytes()
    if hashlib.sha256(packed).hexdigest() != SNAPSHOT_SHA256:
        raise ValueError(f"{SNAPSHOT.name} is not the snapshot this module names (SHA-256 "
                         f"{SNAPSHOT_SHA256[:12]}…): restore it from git, or freeze a new "
                         f"one and put its SHA-256 in SNAPSHOT_SHA256")
    folder = Path(scratch_dir("corpus"))
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(packed))) as tar:
        tar.extractall(folder, filter="data")
    return repository_files(folder)


def digest(files: Sequence[Path]) -> str:
    """The first 12 hex digits of the SHA-256 of the files' bytes, in order, each
    preceded by its length: two corpora with the same digest are the same text."""
    sha = hashlib.sha256()
    for path in files:
        data = Path(path).read_bytes()
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)
    return sha.hexdigest()[:12]


def version(name: str) -> str:
    """The installed version of the package `name` (e.g. "2.1.3" for numpy)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise ValueError(f"package {name!r} is not installed: "
                         f"pip install {name}") from None


def held_out(files: list[Path], every: int = 20) -> tuple[list[Path], list[Path]]:
    """(train, heldout): every `every`-th file (index % every == every - 1) is held
    out. Whole files, not a slice of the stream: a held-out file is text the model never
    saw."""
    if every < 1:
        raise ValueError(f"every={every}: hold out every n-th file with n >= 1")
    train = [f for i, f in enumerate(files) if i % every != every - 1]
    heldout = [f for i, f in enumerate(files) if i % every == every - 1]
    return train, heldout


def _read(path: Path) -> tuple[str, int] | None:
    """(text, bytes read), or None for a file that cannot be read or is not UTF-8."""
    try:
        data = Path(path).read_bytes()
        return data.decode("utf-8"), len(data)
    except (OSError, UnicodeDecodeError):
        return None  # a few test files are Latin-1 on purpose; they are skipped


def read_text(path: Path | str) -> str | None:
    """The file's text (UTF-8), or None if it cannot be read or is not UTF-8."""
    read = _read(Path(path))
    return None if read is None else read[0]


def _texts(files: Sequence[Path]) -> Iterator[str]:
    for path in files:
        text = read_text(path)
        if text is not None:
            yield text


def train_tokenizer(files: list[Path], vocab_size: int = 8192, *,
                    every: int = 4) -> Tokenizer:
    """A byte-level BPE tokenizer with `vocab_size` tokens (EOT included), trained on
    every `every`-th of `files`: a quarter of the corpus finds the same frequent merges
    as all of it, in seconds rather than a minute."""
    if every < 1:
        raise ValueError(f"every={every}: train on every n-th file, n >= 1 (1: all)")
    if vocab_size <= 257:
        raise ValueError(f"vocab_size={vocab_size}: needs more than 257 (256 bytes and "
                         "EOT) to learn any merge")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_texts(files[::every]), trainer=trainer)
    # The literal text "<|endoftext|>" occurs in some sources (transformers' GPT-2
    # code). Encoded as text, it cannot be mistaken for a file boundary: the EOT ids in
    # a stream are exactly the ones `encode` puts between files.
    tokenizer.encode_special_tokens = True
    return tokenizer


def _encode_counted(tokenizer: Tokenizer,
                    files: Sequence[Path]) -> tuple[torch.Tensor, int, int]:
    """(ids, files read, bytes read): each readable file's ids followed by EOT's id."""
    eot = tokenizer.token_to_id(EOT)
    pieces, n_files, n_bytes = [], 0, 0
    for start in range(0, len(files), _ENCODE_CHUNK):
        chunk = files[start: start + _ENCODE_CHUNK]
        reads = [read for read in map(_read, chunk) if read is not None]
        n_files += len(reads)
        n_bytes += sum(size for _, size in reads)
        # encode_batch_fast runs the chunk in parallel in Rust and skips the character
        # offsets, which a training stream does not need.
        encodings = tokenizer.encode_batch_fast([text for text, _ in reads],
                                                add_special_tokens=False)
        for encoding in encodings:
            pieces += [np.asarray(encoding.ids, np.int64), np.array([eot], np.int64)]
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    return torch.from_numpy(ids), n_files, n_bytes


def encode(tokenizer: Tokenizer, files: Sequence[Path]) -> torch.Tensor:
    """The files' token ids as one 1-D int64 CPU tensor: each file's ids, then EOT's id.
    Files that cannot be read as UTF-8 are skipped."""
    return _encode_counted(tokenizer, files)[0]


def decode(tokenizer: Tokenizer, ids) -> str:
    """The text of token ids (a tensor or a sequence of ints), EOT shown as
    "<|endoftext|>" so that file boundaries stay visible."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    return tokenizer.decode(ids, skip_special_tokens=False)


@dataclass(frozen=True)
class Corpus:
    """A tokenizer and the token streams it made: training files and held-out files."""

    tokenizer: Tokenizer
    train: torch.Tensor  # 1-D int64 token ids of the training files, EOT after each
    heldout: torch.Tensor  # the same for the held-out files
    train_files: int  # files read into `train` (unreadable ones are skipped)
    heldout_files: int
    megabytes: float  # of source text read, train and held out (1e6 bytes)
    seconds: float  # to train the tokenizer and encode everything

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def __str__(self) -> str:
        files = self.train_files + self.heldout_files
        return (f"{files:,} files ({self.megabytes:.0f} MB): {len(self.train):,} "
                f"training and {len(self.heldout):,} held-out tokens, vocabulary "
                f"{self.vocab_size:,}, built in {self.seconds:.1f} s")


def build(files: list[Path], *, vocab_size: int = 8192, every: int = 20,
          tokenizer_every: int = 4) -> Corpus:
    """Hold out every `every`-th file, train a tokenizer on every `tokenizer_every`-th
    training file (1: all of them, for a corpus of a few MB), encode both sets; timed
    from the tokenizer's training to the last encoded file."""
    if len(files) < every:
        raise ValueError(f"{len(files)} files given: at least every={every} are "
                         "needed so that one is held out; give more files or a "
                         "smaller `every`")
    train_files, heldout_files = held_out(files, every)
    start = time.perf_counter()
    tokenizer = train_tokenizer(train_files, vocab_size, every=tokenizer_every)
    train, n_train, bytes_train = _encode_counted(tokenizer, train_files)
    heldout, n_heldout, bytes_heldout = _encode_counted(tokenizer, heldout_files)
    seconds = time.perf_counter() - start
    return Corpus(tokenizer, train, heldout, n_train, n_heldout,
                  (bytes_train + bytes_heldout) / 1e6, seconds)


if __name__ == "__main__":  # python -m gpuinfer.model.corpus freeze
    import sys

    if sys.argv[1:] != ["freeze"]:
        sys.exit("usage: python -m gpuinfer.model.corpus freeze")
    print(f"{SNAPSHOT}: SHA-256 {freeze()} (put it in SNAPSHOT_SHA256)")
