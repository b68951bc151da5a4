"""The datatrove side of ``bench/data_prep.py``, run by the bench with the python of a separate
virtualenv that holds datatrove (it is not a dependency of this project).

Usage: ``python _data_prep_datatrove.py CONFIG_JSON``. The config names the corpus
(``train.jsonl``, ``eval.jsonl``), a scratch directory, the output file and the MinHash and
n-gram settings. It runs datatrove's own pipeline, in this process, one task at a time
(``LocalPipelineExecutor(workers=1)``, as the project's preparation is one process):

1. the decontamination index: every ``n``-gram of every eval passage hashed as
   ``NGramsDecontIndexer.compute_hashes`` does (its ``run`` needs lighteval's task registry, so
   the method is called on the passages read here), written as its ``.index.hashes`` file;
2. ``JsonlReader`` → ``MinhashDedupSignature`` (one task);
3. ``MinhashDedupBuckets`` (one task per bucket);
4. ``MinhashDedupCluster`` (one task);
5. ``JsonlReader`` → ``MinhashDedupFilter`` → ``NGramsDecontFilter`` → ``JsonlWriter`` (one
   task; the duplicate filter first, as its document numbers are the reader's), each filter
   with an exclusion writer so the bench knows why each document was removed.

Both MinHash and decontamination tokenise with :class:`SpaceTokenizer` (``str.split``) over text
simplified only by lowercasing and collapsing whitespace (``TextNormConfig``), the same words the
project's near deduplication sees. The clock runs from step 1 to the end of step 5; interpreter
start and imports are outside it. Writes ``{"seconds", "docs", "kept", "removed_minhash",
"removed_decont", "process_cpu_seconds"}`` as JSON to the output file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def main(config_path: str) -> int:
    import numpy as np
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.decont.n_grams import (
        NGramsDecontConfig,
        NGramsDecontFilter,
        NGramsDecontIndexer,
    )
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import create_hash_func
    from datatrove.utils.logging import logger
    from datatrove.utils.text import TextNormConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class SpaceTokenizer(WordTokenizer):
        """Whitespace words (``str.split``), as the project's near deduplication reads them."""

        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    config: dict[str, Any] = json.loads(Path(config_path).read_text(encoding="utf-8"))
    corpus = Path(config["corpus"])
    scratch = Path(config["scratch"])
    logger.remove()  # its progress logging would otherwise go to stderr per document batch
    tokenizer = SpaceTokenizer()
    norm = TextNormConfig(
        lowercase=True,
        norm_whitespace=True,
        remove_punctuation=False,
        norm_unicode_diacritics=False,
        norm_numbers=False,
        norm_weekdays=False,
        norm_monthnames=False,
    )
    minhash = MinhashConfig(
        n_grams=config["shingle_words"],
        num_buckets=config["bands"],
        hashes_per_bucket=config["rows"],
        seed=config["seed"],
        norm_config=norm,
    )
    decont = NGramsDecontConfig(
        n_grams=config["ngram"],
        find_query_ngrams=False,
        find_overlap_ngrams=False,
        norm_config=norm,
    )
    passages = [
        json.loads(line)["text"]
        for line in (corpus / "eval.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]

    def reader() -> Any:
        return JsonlReader(str(corpus), glob_pattern="train.jsonl", compression=None)

    def run(pipeline: list[Any], tasks: int, name: str) -> None:
        LocalPipelineExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=1,
            logging_dir=str(scratch / "logs" / name),
            skip_completed=False,
        ).run()

    cpu_start = time.process_time()
    start = time.perf_counter()

    # 1. The index, hashed exactly as NGramsDecontIndexer hashes a label without a query.
    indexer = SimpleNamespace(
        tokenizer=tokenizer, config=decont, hash_func=create_hash_func(decont.hash_config)
    )
    hashes: set[int] = set()
    for passage in passages:
        hashes.update(NGramsDecontIndexer.compute_hashes(indexer, passage))
    (scratch / "index").mkdir(parents=True)
    np.array(sorted(hashes), dtype=decont.hash_config.np_descr).tofile(
        scratch / "index" / "eval.index.hashes"
    )

    # 2–4. MinHash signatures, buckets, clusters.
    run(
        [
            reader(),
            MinhashDedupSignature(
                output_folder=str(scratch / "signatures"), config=minhash, language=tokenizer
            ),
        ],
        1,
        "signatures",
    )
    run(
        [
            MinhashDedupBuckets(
                input_folder=str(scratch / "signatures"),
                output_folder=str(scratch / "buckets"),
                config=minhash,
            )
        ],
        minhash.num_buckets,
        "buckets",
    )
    run(
        [
            MinhashDedupCluster(
                input_folder=str(scratch / "buckets"),
                output_folder=str(scratch / "remove_ids"),
                config=minhash,
            )
        ],
        1,
        "clusters",
    )
    # 5. Decontaminate and filter the duplicates out, writing what is kept.
    run(
        [
            reader(),
            # The duplicate filter first: its document numbers are the reader's.
            MinhashDedupFilter(
                input_folder=str(scratch / "remove_ids"),
                exclusion_writer=JsonlWriter(str(scratch / "removed_minhash"), compression=None),
            ),
            NGramsDecontFilter(
                index_folder=str(scratch / "index"),
                config=decont,
                language=tokenizer,
                exclusion_writer=JsonlWriter(str(scratch / "removed_decont"), compression=None),
            ),
            JsonlWriter(str(scratch / "output"), compression=None),
        ],
        1,
        "filter",
    )
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start

    def ids(folder: str) -> list[str]:
        found = []
        for path in sorted((scratch / folder).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    found.append(json.loads(line)["id"])
        return found

    kept = ids("output")
    removed_minhash = ids("removed_minhash")
    removed_decont = ids("removed_decont")
    result = {
        "seconds": seconds,
        "process_cpu_seconds": cpu_seconds,
        "docs": len(kept) + len(removed_minhash) + len(removed_decont),
        "kept": len(kept),
        "removed_minhash": removed_minhash,
        "removed_decont": removed_decont,
        "index_hashes": len(hashes),
    }
    Path(config["out"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
