"""Deterministic synthetic corpus of docling-style markdown research papers.

Every paper is produced by our own templates and vocabulary (NLP/ML terms, invented
method and dataset names, generated author names); no real paper text is used.
The output imitates what docling emits for ACL Anthology PDFs: a ``## Title`` line,
author/affiliation paragraphs, ``## Abstract``, numbered ``## 1 Introduction`` style
sections with ``###``/``####`` subsections (and, in some papers, ``#####``/``######``
headings or a "flat" layout where every heading is ``##``), pipe tables with
``Table N:`` captions before or after them, fenced code blocks (some containing lines
that start with ``#``), ``<!-- formula-not-decoded -->`` and ``<!-- image -->``
placeholders, HTML entities, bullet lists, citations, non-ASCII characters, a
``## References`` section and optional ``## A ...`` appendix sections.

Determinism: ``generate_paper(seed, index)`` depends only on its arguments (each
paper gets its own ``random.Random`` seeded from a hash of ``(seed, index)``), so
papers can be generated in any order or in parallel.

Speed: sentences are pre-built at import time as "skeletons" whose generic slots are
already filled and whose per-paper slots (method, task, dataset, ...) are two-character
tokens; a paper is assembled from random skeleton choices and the tokens are replaced
with ``str.replace`` once per paper.  One core produces several tens of MB/s.

CLI::

    python -m verbatim_synth --out DIR --n 100 [--seed 0] [--format md|parquet|jsonl] [--bad]
    python -m verbatim_synth --out DIR --total-mb 1024 --format parquet
"""

# ruff: noqa: E501  (sentence templates, captions and code snippets are long string data)
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import string
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SyntheticPaper",
    "sample_target_chars",
    "target_chars_for",
    "generate_paper",
    "iter_corpus",
    "write_corpus",
    "write_bad_inputs",
    "main",
]

# Size distribution (characters): piecewise lognormal matching the real corpus.
SIZE_MEDIAN = 37_000
SIZE_P90 = 74_000
SIZE_P99 = 162_000
SIZE_MIN = 2_000
SIZE_MAX = 400_000
_Z90 = 1.2815515655446004
_Z99 = 2.3263478740408408
_SIGMA_BODY = math.log(SIZE_P90 / SIZE_MEDIAN) / _Z90
_SIGMA_TAIL = (math.log(SIZE_P99 / SIZE_MEDIAN) - math.log(SIZE_P90 / SIZE_MEDIAN)) / (_Z99 - _Z90)


@dataclass(frozen=True)
class SyntheticPaper:
    paper_id: str
    markdown: str
    metadata: dict


# ---------------------------------------------------------------------------
# Vocabulary (our own word lists).
# ---------------------------------------------------------------------------

TASKS = (
    "named entity recognition", "machine translation", "abstractive summarization",
    "dependency parsing", "open-domain question answering", "natural language inference",
    "aspect-based sentiment analysis", "relation extraction", "coreference resolution",
    "semantic role labeling", "document classification", "dialogue state tracking",
    "entity linking", "morphological inflection", "grammatical error correction",
    "speech translation", "code generation", "fact verification", "event extraction",
    "keyphrase generation", "readability assessment", "stance detection",
    "hate speech detection", "text simplification", "paraphrase identification",
    "semantic parsing", "open information extraction", "argument mining",
    "word sense disambiguation", "cross-lingual retrieval", "data-to-text generation",
    "constituency parsing", "part-of-speech tagging", "discourse parsing",
    "lexical normalization", "commonsense reasoning", "math word problem solving",
    "table question answering", "multi-hop reasoning", "emotion recognition in conversation",
    "claim detection", "query-focused summarization", "story generation",
    "text-to-SQL parsing", "temporal relation extraction", "bilingual lexicon induction",
    "spelling correction", "automated essay scoring", "clinical concept extraction",
    "metaphor detection", "sarcasm detection", "lexical simplification",
    "headline generation", "response generation", "slot filling", "intent detection",
    "citation recommendation", "scientific claim verification", "news recommendation",
    "sign language translation", "transliteration", "diacritic restoration",
)

_SYL1 = (
    "Co", "La", "Re", "Tra", "Gra", "Spa", "Mo", "Flu", "Dis", "Ali", "Ver", "Sy", "Pro",
    "Nex", "Hy", "Ka", "Lu", "Ze", "Ori", "Qua", "Vi", "Bri", "Cal", "Dro", "Eli", "Fen",
    "Gli", "Ha", "Ino", "Jun", "Kel", "Mira", "Nor", "Oc", "Pel", "Rho", "Sil", "Tem",
)
_SYL2 = (
    "ra", "lo", "mi", "ven", "tis", "no", "ga", "ri", "del", "sa", "ton", "ma", "xi",
    "ber", "li", "ca", "do", "ne", "phi", "ru", "vo", "ke", "mo", "sen",
)
_SUFFIX = (
    "BERT", "Net", "Former", "GAN", "LM", "Tune", "Align", "Prompt", "Fuse", "Gen", "Parse",
    "Match", "Distill", "Mix", "Rank", "Span", "Graph", "Ret", "Sum", "QA", "Tag", "Adapt",
    "Flow", "Link", "Chain",
)
_VERSION = ("", "", "", "", "", "-2", "++", "-XL", "-v2", "-L", "*")

DATASETS = (
    "SQuAD 2.0", "CoNLL-2003", "OntoNotes 5.0", "WMT14 En–De", "XSum", "CNN/DailyMail",
    "MultiNLI", "SNLI", "HotpotQA", "Natural Questions", "TriviaQA", "FEVER", "SST-2",
    "SuperGLUE", "XNLI", "WikiANN", "Universal Dependencies v2.10", "Penn Treebank",
    "TACRED", "DocRED", "MultiWOZ 2.1", "Spider", "GSM8K", "BoolQ", "ANLI", "PAWS-X",
    "TyDi QA", "MLQA", "FLORES-200", "IWSLT'17", "ACE 2005", "SciERC", "BioASQ",
    "MIMIC-III", "CommonsenseQA", "WinoGrande", "WikiSQL", "QNLI", "MS MARCO", "BEIR",
)
_DS_SUFFIX = ("Bench", "QA", "-NER", "Corpus", "-X", "Set", "-500", "Eval", "-Hard", "Dial", "Sum", "-MT")

METRICS = (
    "F1", "BLEU", "ROUGE-L", "exact match", "accuracy", "chrF++", "METEOR", "BERTScore",
    "macro-F1", "micro-F1", "perplexity", "word error rate", "LAS", "UAS", "COMET",
    "MRR", "nDCG@10", "Hits@1", "Spearman’s ρ", "Pearson’s r", "ROUGE-2", "recall@5",
    "balanced accuracy", "span F1", "SARI",
)

MODELS = (
    "BERT-base", "BERT-large", "RoBERTa-base", "RoBERTa-large", "XLM-R large", "mBERT",
    "T5-base", "T5-large", "Flan-T5-XL", "BART-large", "mBART-50", "mT5-base",
    "GPT-2 medium", "ELECTRA-large", "DeBERTa-v3-large", "LLaMA-2-7B", "Mistral-7B",
    "ALBERT-xxlarge", "DistilBERT", "SpanBERT", "Longformer", "BigBird", "LaBSE",
    "SciBERT", "BioBERT", "ByT5-small", "Pythia-1.4B", "OPT-6.7B",
)

ARCHS = (
    "transformer encoder", "pointer-generator network", "variational autoencoder",
    "mixture-of-experts layer", "graph attention network", "BiLSTM-CRF tagger",
    "sequence-to-sequence model", "dual encoder", "cross-encoder", "energy-based model",
    "diffusion decoder", "biaffine parser", "memory network", "conditional random field",
    "span classifier", "retriever–reader pipeline", "hypernetwork", "tree-structured LSTM",
    "latent alignment model", "prototype network", "contrastive encoder",
    "neural module network", "recurrent neural network grammar", "edit-based decoder",
)

ADJS = (
    "hierarchical", "contrastive", "sparse", "multilingual", "retrieval-augmented",
    "graph-based", "latent-variable", "curriculum-based", "adversarial", "prompt-based",
    "parameter-efficient", "structure-aware", "syntax-guided", "memory-augmented", "modular",
    "non-autoregressive", "iterative", "bidirectional", "character-level", "span-based",
    "knowledge-enhanced", "uncertainty-aware", "cross-lingual", "multi-task",
    "self-supervised", "weakly supervised", "few-shot", "zero-shot", "lightweight",
    "compositional", "discourse-aware", "entity-centric", "calibrated", "interpretable",
    "label-efficient", "noise-robust", "document-level", "morphology-aware",
    "domain-adaptive", "instruction-tuned",
)

NOUNS = (
    "robustness", "sample efficiency", "calibration", "faithfulness",
    "compositional generalization", "domain shift", "label noise", "exposure bias",
    "tokenization artifacts", "annotation artifacts", "length generalization",
    "lexical overlap", "data contamination", "class imbalance", "catastrophic forgetting",
    "inference cost", "memorization", "factual consistency", "cross-lingual transfer",
    "long-range dependencies", "rare entities", "out-of-distribution inputs",
    "spurious correlations", "model uncertainty", "annotation disagreement",
    "positional bias", "vocabulary mismatch", "temporal drift",
)

LING = (
    "negation", "long-range agreement", "nested entities", "coordination ambiguity",
    "idiomatic expressions", "code-switched input", "rare morphological forms", "ellipsis",
    "discontinuous spans", "implicit discourse relations", "numerical reasoning",
    "pronoun resolution", "multi-word expressions", "sarcastic remarks",
    "temporal expressions", "named entities with diacritics", "quantifier scope",
)

COMPONENT_ADJ = ("gated", "sparse", "lightweight", "hierarchical", "latent", "shared",
                 "dynamic", "bilinear", "recurrent", "adaptive", "two-stage", "residual")
COMPONENTS = ("span scorer", "memory module", "alignment layer", "relation encoder",
              "routing network", "evidence selector", "copy gate", "length predictor",
              "structure prior", "calibration head", "label decoder", "fusion block",
              "retrieval adapter", "consistency critic", "boundary detector")

DOMAINS = ("biomedical", "legal", "news", "social media", "scientific", "financial",
           "clinical", "conversational", "educational", "e-commerce", "historical",
           "patent", "parliamentary", "customer support", "encyclopedic")

LANGS = ("German", "Swahili", "Finnish", "Hindi", "Turkish", "Vietnamese", "Basque",
         "Icelandic", "Yoruba", "Bengali", "Tagalog", "Czech", "Japanese", "Arabic",
         "Portuguese", "Welsh", "Amharic", "Quechua", "Estonian", "Korean", "Hungarian",
         "Urdu", "Maltese", "Zulu")

SURNAMES = (
    "Abara", "Achterberg", "Adeyemi", "Alvarez", "Andersen", "Bakker", "Banerjee", "Barros",
    "Becker", "Bianchi", "Bjørnstad", "Brennan", "Castillo", "Chandra", "Chen", "Costa",
    "Dąbrowski", "Dubois", "Eriksson", "Farouk", "Ferreira", "Fischer", "Gallo", "García",
    "Gupta", "Haddad", "Hansen", "Horváth", "Ibrahim", "Ivanova", "Jansen", "Jiménez",
    "Kato", "Kaur", "Kim", "Kowalski", "Kumar", "Laine", "Larsen", "Lefèvre", "Li",
    "Lindqvist", "Liu", "Lopez", "Mahmoud", "Martín", "Mendes", "Moreau", "Müller",
    "Nakamura", "Nguyen", "Novák", "Nwosu", "Okafor", "Olsen", "Osei", "Park", "Patel",
    "Pereira", "Petrov", "Popescu", "Quispe", "Rahman", "Ramírez", "Rossi", "Sato",
    "Schmidt", "Silva", "Singh", "Søndergaard", "Suzuki", "Tanaka", "Torres", "Tran",
    "Urban", "Vargas", "Virtanen", "Wagner", "Wang", "Weber", "Wójcik", "Xu", "Yamamoto",
    "Yilmaz", "Zhang", "Zhou", "Zieliński", "Öztürk", "Åberg", "O’Neill",
)
GIVEN = (
    "Aarav", "Adaeze", "Agnieszka", "Ahmed", "Aiko", "Alejandro", "Amara", "Ana", "Andrei",
    "Anja", "Arjun", "Astrid", "Bao", "Beatriz", "Bilal", "Camille", "Chiara", "Chidi",
    "Daniela", "Dmitri", "Elif", "Emeka", "Esther", "Fatima", "Felipe", "Freya", "Gabriel",
    "Hana", "Hiroshi", "Inês", "Ingrid", "Ioana", "Jakub", "Javier", "Jia", "Jonas",
    "Julia", "Kai", "Kamala", "Karim", "Katarzyna", "Kenji", "Lars", "Leila", "Liam",
    "Lucía", "Maëlle", "Malik", "Mariam", "Mateo", "Mei", "Mikael", "Nadia", "Naveen",
    "Nikolai", "Noor", "Olga", "Omar", "Paulo", "Priya", "Rafael", "Rania", "Ravi", "Rosa",
    "Saanvi", "Samuel", "Sanne", "Sebastián", "Siddharth", "Sofia", "Søren", "Tariq",
    "Thandiwe", "Tomás", "Valentina", "Wei", "Xiaoming", "Yara", "Yuki", "Zainab", "Zoë",
    "Émile", "Jürgen", "François", "Łukasz", "Hye-jin", "Ji-woo",
)
CITIES = ("Tartu", "Edinburgh", "Lisbon", "Kraków", "Nairobi", "Montréal", "Kyoto",
          "Bengaluru", "Valparaíso", "Utrecht", "Zürich", "Seoul", "Hanoi", "Cairo",
          "Auckland", "Bergen", "Porto", "Lagos", "Toronto", "Melbourne", "Stuttgart",
          "Lyon", "Helsinki", "Ljubljana", "Tbilisi", "Austin", "Pittsburgh", "Singapore",
          "Copenhagen", "Saarbrücken", "Reykjavík", "Bogotá")
COUNTRIES = {"Tartu": "Estonia", "Edinburgh": "United Kingdom", "Lisbon": "Portugal",
             "Kraków": "Poland", "Nairobi": "Kenya", "Montréal": "Canada", "Kyoto": "Japan",
             "Bengaluru": "India", "Valparaíso": "Chile", "Utrecht": "The Netherlands",
             "Zürich": "Switzerland", "Seoul": "South Korea", "Hanoi": "Vietnam",
             "Cairo": "Egypt", "Auckland": "New Zealand", "Bergen": "Norway",
             "Porto": "Portugal", "Lagos": "Nigeria", "Toronto": "Canada",
             "Melbourne": "Australia", "Stuttgart": "Germany", "Lyon": "France",
             "Helsinki": "Finland", "Ljubljana": "Slovenia", "Tbilisi": "Georgia",
             "Austin": "USA", "Pittsburgh": "USA", "Singapore": "Singapore",
             "Copenhagen": "Denmark", "Saarbrücken": "Germany", "Reykjavík": "Iceland",
             "Bogotá": "Colombia"}
COMPANIES = ("Lumen Labs", "Northwind AI", "Polyglot Systems", "Bluefin Research",
             "Arcturus Data", "Kestrel Language Technologies", "Tidewater AI")

# Generic slot pools used while pre-building sentence skeletons.
_SLOT_POOLS: dict[str, tuple] = {
    "gtask": TASKS,
    "arch": ARCHS,
    "adj": ADJS,
    "noun": NOUNS,
    "ling": LING,
    "model": MODELS,
    "dset": DATASETS,
    "lang": LANGS,
    "metric": METRICS,
    "adv": ("significantly", "consistently", "substantially", "slightly", "notably",
            "markedly", "reliably", "modestly"),
    "verbres": ("improves", "increases", "boosts", "raises", "lifts"),
    "qual": ("fluent", "faithful", "coherent", "informative", "consistent", "concise",
             "grammatical", "specific", "diverse"),
    "framing": ("sequence labeling", "span selection", "a generation problem",
                "a ranking problem", "graph prediction", "structured prediction",
                "latent alignment", "a retrieval problem", "pairwise classification",
                "constrained decoding", "a matching problem", "a set prediction problem"),
    "requirement": ("parallel data", "gold syntax trees", "an external knowledge base",
                    "task-specific lexicons", "human-written rationales",
                    "access to model gradients", "large amounts of labeled data",
                    "additional inference passes", "a separate reranking model"),
    "adaptation": ("adapter tuning", "prompt tuning", "continued pretraining",
                   "instruction tuning", "knowledge distillation", "low-rank adaptation",
                   "multi-task ﬁne-tuning", "back-translation", "self-training",
                   "data augmentation", "contrastive pretraining", "active learning"),
    "area": ("computer vision", "information retrieval", "speech processing",
             "reinforcement learning", "cognitive science", "psycholinguistics",
             "program synthesis", "recommender systems"),
    "altname": ("shortcut learning", "spurious correlation", "catastrophic forgetting",
                "covariate shift", "exposure bias", "label leakage", "mode collapse"),
    "sampling": ("in-batch negatives", "hard negative mining", "uniform sampling",
                 "a BM25 retriever", "temperature-scaled sampling", "nucleus sampling"),
    "noise": ("irrelevant tokens", "noisy labels", "distracting passages",
              "spurious features", "off-topic sentences", "duplicated spans"),
    "unit": ("sentence", "document", "dialogue turn", "passage", "query", "source segment",
             "utterance", "paragraph", "claim"),
    "label": ("annotation", "label sequence", "reference text", "answer span",
              "parse tree", "translation", "entity set", "rationale"),
    "shared": ("WMT", "CoNLL", "SemEval", "IWSLT", "BioNLP", "FEVER", "MRQA", "WNUT",
               "SIGMORPHON", "CASE"),
    "opt": ("Adam (Kingma and Ba, 2015)", "AdamW", "Adafactor", "SGD with momentum",
            "LAMB", "Adam with decoupled weight decay"),
    "hw": ("a single NVIDIA A100 GPU", "8 NVIDIA V100 GPUs", "four RTX 3090 cards",
           "a TPU v3-8", "two A6000 GPUs", "a cluster of 32 CPU cores"),
    "hyper": ("learning rate", "batch size", "dropout rate", "number of warmup steps",
              "beam size", "label smoothing factor", "temperature τ", "weight decay"),
    "obs": ("attention weights", "hidden states", "gradient norms", "token embeddings",
            "output distributions", "span representations", "retrieval scores",
            "layer activations"),
    "sym": ("α = 0.5", "λ = 0.1", "β ≤ 0.9", "τ = 0.07", "k ≤ 5", "γ = 2", "ε = 10 − 8",
            "η = 3e-5", "δ ≥ 0.3", "λ → 0", "𝜆 = 0.2", "𝛼 ≤ 0.5"),
    "ent": ("&lt;mask&gt;", "&lt;s&gt;", "&lt;/s&gt;", "&lt;unk&gt;", "&lt;sep&gt;",
            "&lt;pad&gt;"),
    "qa": ("Q&amp;A forums", "R&amp;D reports", "terms &amp; conditions",
           "P&amp;L statements", "questions &amp; answers"),
    "foreign": ("Straßenbahn", "mañana", "façade", "机器翻译", "ありがとう", "привет мир",
                "جامعة", "ελληνικά", "kahvila", "sœur", "İstanbul", "naïve", "🙂", "𝑥 ∈ 𝒳"),
    "quote": ("“hard”", "“easy”", "“ambiguous”", "“unanswerable”", "“noisy”", "“rare”"),
    "num": tuple(f"{x / 10:.1f}" for x in range(200, 990, 3)),
    "gain": tuple(f"{x / 10:.1f}" for x in range(3, 72)),
    "pct": tuple(str(x) for x in range(2, 46)),
    "int": tuple(str(x) for x in range(2, 25)),
    "count": tuple(str(x) for x in range(50, 500, 10)),
    "big": ("1.2M", "350k", "4,500", "12,000", "87k", "2.4M", "9,800", "640k", "23,417"),
    "lr": ("1e-5", "2e-5", "3e-5", "5e-5", "1e-4", "3e-4", "5e-4"),
    "bs": ("8", "16", "32", "64", "128", "256"),
    "hours": ("6", "12", "18", "24", "36", "48", "72"),
    "seeds": ("three", "five", "ten"),
    "vocab": ("8k", "16k", "32k", "50k", "64k", "250k"),
    "maxlen": ("128", "256", "512", "1,024", "2,048", "4,096"),
    "std": ("0.2", "0.3", "0.4", "0.5", "0.7", "0.9"),
    "kappa": ("0.61", "0.68", "0.72", "0.77", "0.81", "0.86"),
    "fig": ("1", "2", "3", "4", "5"),
    "tab": ("1", "2", "3", "4", "5", "6"),
    "eqn": ("1", "2", "3", "4", "5", "6", "7"),
    "appx": ("A", "B", "C", "A.1", "A.2", "B.1", "C.3"),
    "clip": ("0.5", "1.0", "5.0"),
    "hid": ("256", "512", "768", "1,024"),
    "beam": ("4", "5", "8", "10"),
    "year": tuple(str(y) for y in range(2003, 2025)),
    "surname": SURNAMES,
    "ref": tuple(f"[{i}]" for i in range(1, 61)),
    "sec": ("2", "3", "4", "5", "6", "3.2", "4.1", "5.3"),
    "slug": tuple(a.lower() + b + "-" + c for a in _SYL1 for b in _SYL2[:6] for c in ("nlp", "code", "data")),
}

# Sentence openers (prepended to some skeletons whose first word may be lower-cased) and
# tails (inserted before the final period of some skeletons).
_OPENERS = ("In addition, ", "Moreover, ", "As a result, ", "In our experiments, ", "Crucially, ",
            "On the other hand, ", "Following prior work, ", "In practice, ", "Importantly, ",
            "At the same time, ", "For this reason, ", "In particular, ", "As expected, ",
            "By contrast, ", "Empirically, ", "Notably, ", "Overall, ",
            "Unsurprisingly, ", "As noted above, ", "Furthermore, ")
# Per-paper anchors for skeletons that would otherwise mention no distinctive per-paper
# term, so that (almost) every sentence is specific to its paper.
_ANCHOR_TAILS = (" for {M}", " with {M}", " on {D}", " when using the {C}", " on the {D} data",
                 " for the {C}", " in {M}", " on {D} and {E}", " with {m}", " for {M} and {B}",
                 " in the {M} setup", " once the {C} is added")
_ANCHOR_OPENERS = ("For {M}, ", "On {D}, ", "With the {C}, ", "When training {M} on {D}, ",
                   "In our {M} experiments, ", "For the {C}, ", "Using {M}, ",
                   "On the {D} benchmark, ", "In {M}, ", "Across {D} and {E}, ",
                   "Compared with {B}, ", "With {m}, ")
_NOT_LOWERABLE = frozenset(("Table", "Figure", "Section", "Appendix", "Equation", "Algorithm",
                            "English", "Spearman", "Pearson", "Python", "PyTorch", "Transformers"))


def _lowerable(sentence: str) -> bool:
    w = sentence.split(" ", 1)[0]
    return (w.isalpha() and w[1:].islower() and w not in _NOT_LOWERABLE
            and w not in SURNAMES and w not in LANGS and w not in GIVEN)


_TAILS = (" on {dset}", " in the {adj} setting", " (see Section {sec})", " for {lang}",
          " in most of our runs", " across all {seeds} seeds", " (Table {tab})", " on the {A} subset",
          " under a fixed compute budget", " for {ling} in particular", " (Figure {fig})",
          " when trained on {D}", " as discussed in Appendix {appx}", " in line with {citet}")

# Per-paper slots: the skeletons carry these two-character tokens.
_PP = {"M": "\x01M", "m": "\x01m", "T": "\x01T", "Tc": "\x01U", "D": "\x01D",
       "E": "\x01E", "K": "\x01K", "B": "\x01B", "C": "\x01C", "A": "\x01A", "L": "\x01L"}

_TEMPLATES: dict[str, tuple[str, ...]] = {
    "intro": (
        "{Tc} remains a central problem in natural language processing, with applications ranging from {gtask} to {gtask2} {cite}.",
        "Recent work on {T} has relied heavily on large pretrained encoders such as {model} {cite}.",
        "In this paper, we present {M}, {m} designed for {T} in the {A} domain.",
        "We introduce {M}, which combines a {C} with a {adj} {arch} to address {noun} in {T}.",
        "Existing approaches to {T} often struggle with {noun}, especially when training data from {D} is scarce {cite}.",
        "Experiments on {D} and {E} show that {M} {verbres} {K} by {gain} points over a strong {B} baseline.",
        "Our analysis reveals that the {C} is responsible for most of the gains on {ling}.",
        "We release our code, the {D} splits and trained checkpoints to facilitate future research on {T}.",
        "Despite steady progress, state-of-the-art systems for {T} still make systematic errors on {ling} {cite}.",
        "A common remedy is to scale up {model}, but this is costly and offers limited improvements on {noun}.",
        "Unlike prior work that treats {T} as {framing}, we formulate it as {framing2}.",
        "To this end, we propose a {adj} training objective that encourages the {C} to capture {noun}.",
        "Our contributions are threefold: we propose {M}, we construct a new evaluation split of {D}, and we provide a detailed analysis of {noun}.",
        "On {E}, {M} reaches {num} {K}, which is competitive with systems trained on {int} times more data.",
        "The problem is particularly acute for {L}, where annotated resources for {T} are limited.",
        "Human evaluation on {count} randomly sampled outputs confirms that {M} produces more {qual} outputs than {B}.",
        "Figure {fig} illustrates a typical failure case of current {T} systems on {A} text.",
        "This raises the question of whether {noun} can be addressed without sacrificing efficiency.",
        "We hypothesize that explicitly modeling {ling} is key to robust {T}.",
        "Most benchmarks for {T}, including {D}, were collected from {A} sources and may overestimate real-world performance {cite}.",
        "Moreover, {M} requires no {requirement}, which makes it applicable to low-resource settings such as {L}.",
        "The remainder of this paper is organized as follows: Section 2 reviews related work, Section 3 describes {M}, and Section 4 presents our experiments.",
        "Interest in {T} has grown rapidly in the {A} community, driven by the availability of resources such as {D} {cite}.",
        "We further show that {M} transfers to {E} in a zero-shot setting with only a small loss in {K}.",
        "Compared with {B}, our approach uses {pct} % fewer parameters and runs twice as fast at inference time.",
        "Yet little is known about how {noun} affects {T} when models are deployed on {A} data.",
        "The key idea behind {M} is to let the {C} decide which parts of the {unit} deserve more capacity.",
        "We argue that {T} benchmarks such as {D} reward surface heuristics rather than genuine understanding of {ling}.",
        "Building on {citet}, we revisit the assumption that more {label}s always lead to better {T} systems.",
        "Large language models have recently been applied to {T} with promising but inconsistent results {cite}.",
        "Practitioners working with {L} {unit}s face an additional challenge: off-the-shelf tokenizers fragment words into many subwords.",
        "We make three observations that motivate our design.",
        "Our main finding is that a small {C} trained on {D} rivals much larger systems on {ling}.",
        "To our knowledge, this is the first study that evaluates {T} systems on {qa}.",
        "Concretely, {M} learns to rank candidate {label}s while keeping the backbone frozen.",
        "These limitations make current {T} pipelines brittle under {noun}.",
        "Code and data are available at https://github.com/anonymous/{slug}.",
        "Throughout the paper, we use {K} as the primary metric and report {metric} as a secondary one.",
        "Figure {fig} contrasts the predictions of {B} and {M} on an example from {E}.",
        "Motivated by findings in {area}, we treat {noun} as a first-class modeling concern.",
    ),
    "related": (
        "Early approaches to {gtask} relied on hand-crafted features and {adj} {arch}s {cite}.",
        "{surname} et al. ({year}) were the first to apply a {arch} to {gtask}, reporting strong results on {dset}.",
        "More recently, {model} has been adapted to {T} through {adaptation} {cite}.",
        "Our work is closely related to studies of {noun} in {gtask} {cite}, but differs in that we focus on {T}.",
        "Several benchmarks have been proposed for {T}, including {D}, {dset} and {dset2} {cite}.",
        "A parallel line of research investigates {adj} models for {gtask} {cite}.",
        "Work on {ling} has shown that pretrained encoders capture surprisingly little about {noun} {cite}.",
        "In contrast to the {adj} {arch} of {surname} and {surname2} ({year}), {M} does not require {requirement}.",
        "Methods based on {adaptation} {cite} are complementary to ours and could be combined with the {C}.",
        "Related ideas have appeared in the {area} literature {cite}, where {noun} is studied under the name of {altname}.",
        "{surname} ({year}) propose a {adj} variant of {model} and evaluate it on {dset} {ref}.",
        "Prior studies of {T} in the {A} domain mostly rely on {B} {ref}.",
        "Multilingual extensions have been explored for {lang} and {lang2} {cite}, although results remain uneven across languages.",
        "The closest work to ours is {citet}, which also uses a {C} but trains it with {adaptation}.",
        "Surveys of {gtask} {cite} highlight {noun} as an open challenge.",
        "Evaluation practices for {T} have been criticized for over-reliance on {K} {cite}.",
        "{surname} et al. ({year}) analyze {obs} of {model} and find that they encode {ling} only in higher layers.",
        "Approaches that frame {gtask} as {framing} {cite} have inspired our formulation.",
        "Data augmentation for {T} has been studied extensively {ref}, with mixed results on {dset}.",
        "Finally, a growing body of work studies {noun} in large language models {cite}.",
        "Benchmarks such as {dset} have driven much of the recent progress in {gtask} {cite}.",
        "{citet} introduce a {adj} objective for {gtask} that is conceptually similar to the one used by the {C}.",
        "Another strand of work studies how {model} handles {ling} {cite}.",
        "Retrieval-based methods {cite} condition generation on passages from an external corpus.",
        "Cross-lingual approaches to {T} typically pivot through English {cite}, which is problematic for {L}.",
        "Several authors have questioned whether gains on {dset} transfer to realistic {A} settings {cite}.",
        "Our formulation generalizes the {framing} view adopted by {citet}.",
        "Efficient variants of {model} reduce inference cost through pruning, quantization or {adaptation} {cite}.",
        "{surname} et al. ({year}) collected {big} annotated {unit}s, which we use for pretraining the {C}.",
        "Interpretability studies on {gtask} mostly inspect {obs} {cite}.",
        "Compared with these studies, we focus on {noun} in the {A} domain.",
        "There is also a rich literature on evaluation metrics for {gtask}, including {metric} and {metric2} {cite}.",
    ),
    "method": (
        "Given an input sequence x = ( x 1 , . . . , x n ), {M} first encodes each token with {model} to obtain contextual representations.",
        "The {C} then aggregates these representations using {adj} attention over {int} heads.",
        "Formally, let h i denote the hidden state of the i -th token; we compute a score for each candidate as shown in Equation {eqn}.",
        "We optimize the sum of the cross-entropy loss and an auxiliary {adj} loss weighted by {sym}.",
        "During training, we sample negative examples from {D} using {sampling}.",
        "This design allows {M} to model {noun} without substantially increasing the number of parameters.",
        "The {C} is implemented with {int} layers and a hidden size of {hid}.",
        "At inference time, we use beam search with a beam size of {beam} and length normalization.",
        "Intuitively, the {C} acts as a soft filter that suppresses {noise} before they reach the decoder.",
        "We share parameters between the encoder and the {C} to reduce memory consumption.",
        "The overall architecture of {M} is illustrated in Figure {fig}.",
        "Note that when {sym}, the objective reduces to standard maximum likelihood training.",
        "To stabilize training, we apply gradient clipping at {clip} and layer normalization after each residual block.",
        "Each training instance consists of a {unit} paired with its gold {label} from {D}.",
        "We treat {T} as {framing} over the output of the {C}.",
        "The special token {ent} marks the boundary between the {unit} and its context.",
        "Scores are normalized with a softmax over all candidates, where the temperature is set to {sym}.",
        "We initialize the {C} from {model} and keep the embedding layer frozen during the first {int} epochs.",
        "Because the candidate space grows quadratically with length, we prune candidates longer than {int} tokens.",
        "The final prediction is obtained by combining the outputs of the {C} and the {adj} {arch} with a learned gate.",
        "In the {A} setting, inputs are first segmented into {unit}s of at most {maxlen} tokens.",
        "This objective can be seen as a {adj} relaxation of the original {T} problem.",
        "We denote the resulting model {M} and its variant without the {C} as {M}-base.",
        "The computational cost is O ( n · k ) for n input tokens and k ≤ {int} candidates.",
        "Following {citet}, we use a {adj} prior over latent structures.",
        "The representation of a candidate is the concatenation [ h s ; h e ; h s ⊙ h e ] of its boundary states.",
        "Figure {fig} gives an overview of the three stages of {M}: encoding, selection and prediction.",
        "For each {unit}, the {C} outputs a distribution over {count} latent slots.",
        "We found it beneficial to warm up the {C} on {E} before training on {D}.",
        "The loss is averaged over tokens rather than sequences, which prevents long {unit}s from dominating the gradient.",
        "The {C} has access only to the encoder output, so the backbone can be swapped without changes to the rest of the model.",
        "In contrast to {B}, {M} predicts all {label}s in parallel, which reduces decoding time.",
        "To handle inputs longer than {maxlen} tokens, we split them into overlapping windows with a stride of {int} tokens.",
        "The gate value g is computed from the mean-pooled representation of the {unit} followed by a sigmoid.",
        "We use a {adj} curriculum that presents easy examples first and gradually introduces {ling}.",
        "Each component is trained jointly, except the tokenizer, which we inherit from {model}.",
        "Candidates whose score falls below a threshold of {sym} are discarded before decoding.",
        "We additionally distill the predictions of an ensemble of {int} models into a single {C}.",
        "This choice keeps the number of trainable parameters below {pct} % of the full model.",
        "Algorithm 1 summarizes the training procedure of {M}.",
    ),
    "setup": (
        "We evaluate on {D}, which contains {big} training examples and {count} test examples.",
        "We follow the standard splits of {E} and report {K} averaged over {seeds} random seeds.",
        "All models are trained with {opt} using a learning rate of {lr} and a batch size of {bs}.",
        "Training takes approximately {hours} hours on {hw}.",
        "We compare against {B}, {model}, and a {adj} {arch} baseline {cite}.",
        "Hyperparameters were tuned on the development set of {D} using grid search over the {hyper}.",
        "For {L}, we use the data released by the {shared} shared task {cite}.",
        "Text is tokenized with a SentencePiece model with a vocabulary of {vocab} subwords.",
        "We discard training examples longer than {maxlen} tokens, which affects less than {pct} % of {D}.",
        "Statistical significance is assessed with a paired bootstrap test (p &lt; 0.05).",
        "Our implementation builds on PyTorch and the Transformers library {cite}.",
        "For all baselines we use the hyperparameters recommended by their authors.",
        "We additionally construct a challenge set of {count} {unit}s from {E} that contain {ling}.",
        "The {A} portion of {D} was filtered to remove {noise} and near-duplicates.",
        "We early-stop on development {K} with a patience of {int} evaluations.",
        "Scores are computed with the official evaluation script of {D}.",
        "Each configuration is run with {seeds} seeds and we report the mean and standard deviation.",
        "Unless stated otherwise, the maximum input length is {maxlen} tokens.",
        "Data statistics are listed in Table {tab}; {E} is considerably smaller than {D}.",
        "We use {model} as the backbone for {M} and for all ﬁne-tuned baselines.",
        "The annotation was carried out by {int} trained annotators with a background in linguistics.",
        "Test sets were collected from {qa} and manually verified.",
        "The development set is used for model selection only; all numbers are reported on the held-out test set.",
        "We reimplemented {B} because the original code was not available.",
        "For the {L} experiments we rely on the {dset} splits, which contain {big} {unit}s.",
        "Inputs are lower-cased and Unicode-normalized only for the baselines that require it.",
        "We run all experiments with mixed precision and a maximum of {maxlen} tokens per batch element.",
        "Human judges rated {count} outputs on a five-point scale for fluency and adequacy.",
        "The total compute budget for this paper was roughly {count} GPU hours.",
        "We also report results of {model} prompted with {int} in-context examples.",
        "Following standard practice, we report {K} for {D} and {metric} for {E}.",
        "Checkpoints are selected by development {K} and averaged over the last {int} saves.",
        "The {A} subset of {E} serves as an out-of-domain test set.",
        "We use the {hyper} values listed in Table {tab} for all runs.",
    ),
    "results": (
        "Table {tab} summarizes the main results on {D} and {E}.",
        "{M} outperforms {B} by {gain} {K} points on average, with the largest improvements on {ling}.",
        "Interestingly, the gap between {M} and {model} narrows when more training data is available.",
        "The improvements are statistically significant (p &lt; 0.01) for all but one setting.",
        "On {E}, our approach achieves {num} {K}, a new state of the art among models of comparable size.",
        "Removing the {C} leads to a drop of {gain} points, confirming its importance.",
        "We observe that performance saturates after roughly {int} training epochs.",
        "Performance on {L} lags behind, which we attribute to the smaller size of the training data.",
        "As shown in Figure {fig}, {K} increases steadily with the number of retrieved passages up to k = {int}.",
        "{B} performs competitively on short inputs but degrades sharply for inputs longer than {maxlen} tokens.",
        "The variance across random seeds is small (± {std}), suggesting that the gains are robust.",
        "Scaling the backbone from base to large size yields a further {gain} points in {K}.",
        "Zero-shot transfer from {D} to {E} retains {pct} % of the in-domain performance.",
        "{M} is {adv} better than {B} on {ling}, while both systems perform similarly on the remaining examples.",
        "Models trained with {adaptation} benefit less from the {C}, suggesting that the two mechanisms overlap.",
        "Surprisingly, {model} without ﬁne-tuning is a strong baseline, reaching {num} {K} on {D}.",
        "In the low-resource setting with {count} training examples, {M} improves over {B} by {gain} points.",
        "The results in Table {tab} also show that {K} and human judgments do not always agree.",
        "Our best configuration obtains {num} {K} on the hidden test set of {D}.",
        "Compared to the numbers reported by {citet}, our reimplementation of {B} is within {std} points.",
        "For {L}, {M} reaches {num} {K}, a gain of {gain} over the multilingual baseline.",
        "The gains are largest in the low-resource regime and shrink as the training set grows.",
        "Even the smallest variant of {M} beats {model} on {E}.",
        "{M} closes {pct} % of the gap between {B} and the human upper bound on {D}.",
        "All differences between {M} and the baselines are significant according to a paired bootstrap test.",
        "We report results on the official leaderboard of {D} in Table {tab}.",
        "On the challenge set, {B} drops by {gain} points while {M} loses only {gain2}.",
        "Prompting {model} yields {num} {K}, well below the ﬁne-tuned systems.",
        "Combining {M} with {adaptation} gives an additional improvement of {gain} points.",
        "Results for {L} follow the same trend, although absolute scores are lower.",
        "Inference with {M} is {int} times faster than with {B} on {hw}.",
        "Human evaluators preferred outputs of {M} in {pct} % of the pairwise comparisons.",
        "The only setting where {M} underperforms is {E}, where {B} benefits from in-domain pretraining.",
    ),
    "analysis": (
        "To better understand where {M} helps, we manually inspect {count} errors made on the development set of {D}.",
        "The most frequent error category involves {ling}, accounting for {pct} % of all errors.",
        "We find that the {C} attends primarily to {obs} associated with {noun}.",
        "Figure {fig} plots {K} as a function of input length.",
        "Qualitatively, outputs of {M} are more {qual} and contain fewer hallucinated entities than those of {B}.",
        "A closer look at the {obs} reveals a clear separation between correct and incorrect predictions.",
        "We further test robustness by evaluating on {E} without any additional ﬁne-tuning.",
        "Annotators reached an inter-annotator agreement of κ = {kappa} on this subset.",
        "Errors on {L} inputs are dominated by tokenization issues and rare morphology.",
        "For example, the {L} phrase “{foreign}” is frequently mishandled by {B} but correctly processed by {M}.",
        "We also examine {quote} examples, defined as instances on which all baselines fail.",
        "Ablating the {adj} objective reduces {K} by {gain} points, while removing the {C} costs {gain2} points.",
        "The learned gate assigns higher weight to the {C} for {ling}, which matches our intuition.",
        "Probing classifiers trained on {obs} achieve {num} % accuracy at predicting {ling}.",
        "When inputs contain {ent} tokens, {M} degrades gracefully whereas {B} often copies them verbatim.",
        "Performance drops by {gain} points when evaluated on {A} text outside the training distribution.",
        "These findings suggest that {noun} rather than model capacity limits performance on {T}.",
        "Increasing the number of candidates beyond {int} brings no further benefit and slows down decoding.",
        "Out of {count} sampled outputs, {pct} were judged fully correct by both annotators.",
        "The remaining errors mostly stem from annotation inconsistencies in {D}.",
        "We note that {M} sometimes over-generates {ling}, a behaviour also reported for {model} {cite}.",
        "Table {tab} breaks down {K} by error category.",
        "Most remaining errors concern {ling} in long {unit}s.",
        "We visualize the {obs} for a sample of {count} {unit}s in Figure {fig}.",
        "The correlation between model confidence and {K} is weak (Spearman’s ρ = 0.{int}).",
        "Performance on {quote} cases improves the most, by {gain} points.",
        "Longer training does not remove the errors on {ling}, which points to a data issue rather than an optimization issue.",
        "When we shuffle the word order of the input, {K} drops by only {gain} points, suggesting reliance on lexical cues.",
        "Replacing the {C} with a simple average of the {obs} costs {gain} points.",
        "We observe qualitatively similar behaviour on {dset}.",
        "Manual inspection shows that {pct} % of the flagged {label}s in {D} are in fact correct.",
        "Interestingly, the model rarely fails on {ling} when the {unit} is short.",
        "The learning curves in Figure {fig} indicate that {M} is more sample-efficient than {B}.",
    ),
    "conclusion": (
        "We presented {M}, {m} for {T}.",
        "Our experiments on {D} and {E} demonstrate consistent gains over {B}.",
        "In future work, we plan to extend {M} to {gtask} and to languages beyond {L}.",
        "We hope that {M} will serve as a useful baseline for future work on {noun}.",
        "Our analysis shows that the {C} is particularly helpful for {ling}.",
        "An interesting direction is to combine {M} with {adaptation}.",
        "Our study has several limitations.",
        "First, all experiments are conducted on {D} and {E}, which may not reflect the diversity of real-world {A} text.",
        "Second, training {M} requires {hw}, which may not be available to all researchers.",
        "Finally, we only evaluate with {K}, which is known to correlate imperfectly with human judgments {cite}.",
        "We did not evaluate on languages other than English and {L}.",
        "All datasets used in this work are publicly available under research licenses.",
        "We thank the anonymous reviewers for their helpful comments on {T}.",
        "Our models may reproduce biases present in {D}, and we caution against deployment without further auditing.",
        "Our results highlight the importance of modeling {noun} explicitly.",
        "We believe that the proposed {C} is applicable beyond {T}.",
        "Another limitation is that the {C} adds latency when the candidate set is large.",
        "We encourage future work to report results on {E} in addition to {D}.",
        "The annotation of {E} was funded by a research grant and annotators were paid above the minimum wage.",
        "This work was supported in part by a national research council grant.",
    ),
    "where": (
        "where h i is the representation produced by the {C} and W is a learned projection.",
        "where {sym} controls the trade-off between the two objectives.",
        "where y * denotes the gold {label} and p θ the model distribution.",
        "where the sum ranges over all candidates in the {unit}.",
        "where σ is the sigmoid function and ⊙ denotes element-wise multiplication.",
    ),
    "generic": (
        "This observation is consistent with earlier findings on {noun} {cite}.",
        "We leave a more systematic investigation of {noun} to future work.",
        "See Appendix {appx} for additional details.",
        "For comparison, a {adj} {arch} {cite} reports {num} {K} on the same split.",
        "These results hold across all {seeds} random seeds.",
        "A similar trend is observed for {gtask} {ref}.",
        "We provide further examples in Appendix {appx}.",
        "This is in line with the intuition that modeling {ling} requires broader context.",
        "Overall, {M} offers a favourable trade-off between accuracy and efficiency.",
        "In practice, we found the {hyper} to matter more than the choice of optimizer.",
        "Note that {D} contains many {unit}s with {ling}, which makes it a challenging testbed.",
        "The same pattern holds for {E}, albeit with smaller margins.",
        "We return to this point in Section {sec}.",
        "Details of the annotation protocol are given in Appendix {appx}.",
        "This effect is most visible for {ling}.",
        "The trend is consistent across {D} and {E}.",
        "We discuss possible explanations below.",
        "This is discussed further in Section {sec}.",
    ),
}

_TITLE_TEMPLATES = (
    "{M}: {Adj} {Arch}s for {Task}",
    "{Adj} {Task} with {M}",
    "{M}: Improving {Task} through {Adaptation}",
    "On the {Noun} of {Model} for {Task}",
    "Towards {Adj} {Task} in {Domain} Text",
    "Learning {Adj} Representations for {Lang} {Task}",
    "When Does {Adaptation} Help {Task}? Evidence from {D}",
    "{D}: A Benchmark for {Domain} {Task}",
    "Revisiting {Noun} in {Task}",
    "{M}: A {Adj} Approach to {Task} under {Noun}",
    "Beyond {Model}: {Adj} {Task} for {Lang}",
    "Mind the {Noun}: {Adj} {Task} with {M}",
)

_SUBTITLES = {
    "method": ("Problem Formulation", "Encoder", "Training Objective", "Decoding",
               "Candidate Generation", "Model Architecture", "Inference", "Overview",
               "Data Augmentation", "Regularization", "Complexity", "Span Representation",
               "Retrieval Component", "Pretraining", "Notation"),
    "setup": ("Datasets", "Baselines", "Implementation Details", "Evaluation Metrics",
              "Training Details", "Preprocessing", "Hyperparameters", "Human Evaluation Setup",
              "Data Collection", "Annotation"),
    "results": ("Main Results", "Low-Resource Setting", "Cross-Domain Results",
                "Multilingual Results", "Human Evaluation", "Efficiency", "Zero-Shot Transfer",
                "Comparison with Large Language Models"),
    "analysis": ("Ablation Study", "Error Analysis", "Qualitative Examples",
                 "Effect of Input Length", "Attention Analysis", "Robustness",
                 "Effect of Training Data Size", "Case Study", "Probing"),
    "appendix": ("Hyperparameter Search", "Additional Results", "Dataset Details",
                 "Annotation Guidelines", "Prompt Templates", "Qualitative Examples",
                 "Computational Budget", "Per-Language Results", "Reproducibility Checklist"),
}
_SUBTITLE_NOUNS = ("Label Noise", "Model Size", "Context Length", "Tokenization",
                   "Negative Sampling", "Pretraining Data", "Beam Size", "Temperature",
                   "Learning Rate", "Random Seeds", "Domain Shift", "Annotation Quality")
_H56_TITLES = ("Training details", "Hyperparameters", "Preprocessing", "Hardware",
               "Evaluation protocol", "Data filtering", "Tokenization", "Prompt format",
               "Model selection", "Decoding settings")
_APPENDIX_TITLES = ("Appendix", "Hyperparameter Details", "Additional Results",
                    "Dataset Details", "Annotation Guidelines", "Prompt Templates",
                    "Qualitative Examples", "Computational Budget", "Per-Language Results",
                    "Proofs", "Error Categories", "Human Evaluation Interface")

_TABLE_CAPTIONS = {
    "results": ("Main results on {D} and {E}. Best scores are in bold; † marks significant improvements over {B} (p &lt; 0.05).",
                "{K} scores (%) for {T} across datasets. Results are averaged over three runs.",
                "Comparison of {M} with previous work on the test set of {D}.",
                "Results on {E} in the zero-shot setting."),
    "stats": ("Statistics of the datasets used in our experiments.",
              "Number of {unit}s per split in {D} and {E}.",
              "Dataset statistics. Avg. len. is measured in subword tokens."),
    "ablation": ("Ablation study of {M} on the development set of {D}.",
                 "Effect of removing individual components of {M} ({K})."),
    "hyper": ("Hyperparameters used for training {M}.",
              "Search space and selected values of the hyperparameters."),
    "lang": ("{K} per language for {T}. Languages are sorted by training set size.",
             "Per-language results on the multilingual test set."),
}
_FIG_CAPTIONS = ("Overview of {M}. The {C} receives the encoder states and produces the final scores.",
                 "{K} on {D} as a function of training set size.",
                 "Attention patterns of the {C} for an example from {E}.",
                 "Distribution of error categories for {M} and {B}.",
                 "Effect of the {hyper} on development {K}.",
                 "An example input from {D} with predictions of {B} and {M}.")

_CODE_SNIPPETS = (
    ("python", "import torch\nfrom torch import nn\n\n# Configuration for \x01M (see Table @tab@)\nLR = @lr@\nWARMUP_STEPS = @warm@\n\n\nclass SpanScorer(nn.Module):\n    # scores every candidate span with a bilinear layer\n    def __init__(self, hidden: int = @hid@):\n        super().__init__()\n        self.proj = nn.Linear(hidden, hidden)\n\n    def forward(self, h, mask):\n        # h: (batch, seq, hidden)\n        s = self.proj(h) @ h.transpose(1, 2)\n        return s.masked_fill(~mask, -1e4)"),
    ("python", "# not a heading: this comment starts with a hash\ndef normalize(text):\n    # lower-case and collapse whitespace before matching\n    return \" \".join(text.lower().split())\n\n## also not a heading\nscores = {k: round(v, @prec@) for k, v in results.items()}\nprint(f\"\x01K = {scores['test']:.@prec@f}\")"),
    ("bash", "#!/usr/bin/env bash\n# fine-tune \x01M on @dset@\npython train.py \\\n  --model @model@ \\\n  --lr @lr@ --batch-size @bs@ \\\n  --epochs @epochs@ --seed @seed@\n# evaluate on the test split\npython evaluate.py --split test --output preds_@seed@.jsonl"),
    ("yaml", "# \x01M configuration\nmodel:\n  encoder: @model@\n  hidden_size: @hid@\n  dropout: 0.@drop@\ntraining:\n  optimizer: adamw\n  lr: @lr@\n  batch_size: @bs@\n  max_epochs: @epochs@\n# end of config"),
    ("json", "{\n  \"id\": \"@hexid@\",\n  \"task\": \"\x01T\",\n  \"input\": \"Example @unit@ taken from the development split\",\n  \"label\": \"@label@\",\n  \"score\": @num@\n}"),
    ("text", "### Instruction:\nYou are an expert annotator for \x01T. Read the input and give the answer only.\n\n### Input:\n{input}\n\n### Response:"),
    ("text", "Algorithm 1: Training procedure of \x01M\n1: for epoch = 1 to @epochs@ do\n2:   for each batch B in D do\n3:     compute loss L(B; θ)\n4:     θ ← θ − η ∇L\n5:   end for\n6: end for"),
    ("markdown", "# System prompt\nYou label each @unit@ for \x01T.\n## Output format\n- one label per line\n- no explanations"),
    ("python", "from datasets import load_dataset\n\n# load the @dset@ data used in Section @sec@\nds = load_dataset(\"@slug@\", split=\"train\")\nds = ds.filter(lambda ex: len(ex[\"text\"]) < @maxlen@)\n# keep @pct@ % for validation\nsplits = ds.train_test_split(test_size=0.@pct@, seed=@seed@)"),
)

_REF_VENUES = (
    "Proceedings of the {y} Conference on Empirical Methods in Natural Language Processing",
    "Proceedings of the {n}th Annual Meeting of the Association for Computational Linguistics (Volume 1: Long Papers)",
    "Proceedings of the {y} Conference of the North American Chapter of the Association for Computational Linguistics: Human Language Technologies",
    "Findings of the Association for Computational Linguistics: EMNLP {y}",
    "Proceedings of the {n}th International Conference on Computational Linguistics",
    "Proceedings of the {n}th Conference on Computational Natural Language Learning",
    "Proceedings of the Thirteenth Language Resources &amp; Evaluation Conference",
    "Proceedings of the {n}th Workshop on Innovative Use of NLP for Building Educational Applications",
)
_REF_CITIES = ("Online", "Dublin, Ireland", "Toronto, Canada", "Abu Dhabi, United Arab Emirates",
               "Singapore", "Seattle, United States", "Florence, Italy", "Marseille, France",
               "Punta Cana, Dominican Republic", "Barcelona, Spain (Online)", "Brussels, Belgium")


# ---------------------------------------------------------------------------
# Pools built once at import time.
# ---------------------------------------------------------------------------

def _ascii(s: str) -> str:
    return unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii")


def _make_cite(rng: random.Random) -> str:
    r = rng.random()
    y = rng.randint(2005, 2024)
    s1, s2 = rng.choice(SURNAMES), rng.choice(SURNAMES)
    if r < 0.45:
        return f"({s1} et al., {y})"
    if r < 0.6:
        return f"({s1} and {s2}, {y})"
    if r < 0.7:
        return f"({s1}, {y})"
    if r < 0.8:
        return f"({s1} et al., {y}; {s2} et al., {rng.randint(2005, 2024)})"
    if r < 0.92:
        return f"[{rng.randint(1, 60)}]"
    a = rng.randint(1, 50)
    return f"[{a}–{a + rng.randint(1, 4)}]" if rng.random() < 0.5 else f"[{a}, {a + rng.randint(1, 9)}]"


def _make_cite2(rng: random.Random) -> str:
    s1 = rng.choice(SURNAMES)
    return f"{s1} et al. ({rng.randint(2005, 2024)})"


def _title_case(s: str) -> str:
    small = {"a", "an", "the", "for", "of", "in", "on", "with", "and", "to", "from", "under", "by", "via"}
    out = []
    for i, w in enumerate(s.split(" ")):
        if i > 0 and w in small:
            out.append(w)
        elif w[:1].islower() and not any(c.isupper() for c in w):  # keep mBART, mT5, ...
            out.append("-".join(p[:1].upper() + p[1:] for p in w.split("-")))
        else:
            out.append(w)
    return " ".join(out)


def _build_sentence_pools(rng: random.Random) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Per section kind: a tuple of groups, one group of filled skeletons per template."""
    fmt = string.Formatter()
    slot_pools = dict(_SLOT_POOLS)
    slot_pools["cite"] = tuple(_make_cite(rng) for _ in range(3000)) + ("",) * 300
    slot_pools["citet"] = tuple(_make_cite2(rng) for _ in range(800))

    def parse(t: str) -> tuple[str, list[tuple[str, tuple]]]:
        fields = [f for _, f, _, _ in fmt.parse(t) if f and f not in _PP]
        return t, [(f, slot_pools[f.rstrip("0123456789")]) for f in fields]

    tails = [parse(t) for t in _TAILS]
    anchor_tails = [t.format(**_PP) for t in _ANCHOR_TAILS]
    anchor_openers = [t.format(**_PP) for t in _ANCHOR_OPENERS]
    per_template = {"where": 60, "generic": 60}
    pools: dict[str, list[tuple[str, ...]]] = {}
    choice = rng.choice
    r = rng.random
    for kind, templates in _TEMPLATES.items():
        groups = []
        for t in templates:
            tpl, fields = parse(t)
            can_lower = _lowerable(t)
            strong = any("{" + k + "}" in t for k in ("M", "D", "C", "m"))
            inst = []
            for _ in range(per_template.get(kind, 120)):
                d = dict(_PP)
                for f, pool in fields:
                    d[f] = choice(pool)
                s = tpl.format(**d).replace("  ", " ").replace(" .", ".")
                if kind != "where":
                    lower = can_lower
                    tail_ok = s.endswith(".") and s[-2] not in ")]"
                    if not strong and r() < 0.92:
                        # anchor the sentence to its paper with a tail or an opener
                        if tail_ok and (not lower or r() < 0.5):
                            s = s[:-1] + choice(anchor_tails) + "."
                        elif lower:
                            s = choice(anchor_openers) + s[0].lower() + s[1:]
                            lower = False
                    if tail_ok and r() < 0.2:
                        ttpl, tfields = choice(tails)
                        td = dict(_PP)
                        for f, pool in tfields:
                            td[f] = choice(pool)
                        s = s[:-1] + ttpl.format(**td) + "."
                    if lower and r() < 0.25:
                        s = choice(_OPENERS) + s[0].lower() + s[1:]
                if s[0].islower() and kind != "where":
                    s = s[0].upper() + s[1:]
                inst.append(s)
            groups.append(tuple(inst))
        pools[kind] = groups
    generic = pools.pop("generic")
    final = {}
    for kind, groups in pools.items():
        final[kind] = tuple(groups) if kind == "where" else tuple(groups + generic)
    final["appendix"] = final["setup"] + final["results"][:10] + final["analysis"][:10]
    final["limitations"] = final["conclusion"]
    return final


def _build_refs(rng: random.Random, n: int) -> tuple[str, ...]:
    refs = []
    for _ in range(n):
        k = rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5, 6))
        names = [f"{rng.choice(GIVEN)} {rng.choice(SURNAMES)}" for _ in range(k)]
        if k == 1:
            authors = names[0]
        elif k == 2:
            authors = f"{names[0]} and {names[1]}"
        else:
            authors = ", ".join(names[:-1]) + ", and " + names[-1]
        y = rng.randint(2003, 2024)
        title = _title_case(rng.choice(_TITLE_TEMPLATES).format(
            M=rng.choice(_SYL1) + rng.choice(_SYL2) + rng.choice(_SUFFIX),
            Adj=rng.choice(ADJS), Arch=rng.choice(ARCHS), Task=rng.choice(TASKS),
            Adaptation=rng.choice(_SLOT_POOLS["adaptation"]), Noun=rng.choice(NOUNS),
            Model=rng.choice(MODELS), Domain=rng.choice(DOMAINS), Lang=rng.choice(LANGS),
            D=rng.choice(DATASETS)))
        if title[:1].islower():
            title = title[0].upper() + title[1:]
        r = rng.random()
        if r < 0.6:
            venue = rng.choice(_REF_VENUES).format(y=y, n=rng.randint(20, 62))
            p1 = rng.randint(1, 9000)
            refs.append(f"{authors}. {y}. {title}. In {venue} , pages {p1}–{p1 + rng.randint(5, 14)}, "
                        f"{rng.choice(_REF_CITIES)}. Association for Computational Linguistics.")
        elif r < 0.85:
            refs.append(f"{authors}. {y}. {title}. arXiv preprint arXiv:{y % 100:02d}{rng.randint(1, 12):02d}."
                        f"{rng.randint(0, 99999):05d} .")
        else:
            p1 = rng.randint(1, 900)
            journal = rng.choice(("Transactions of the Association for Computational Linguistics",
                                  "Computational Linguistics", "Journal of Machine Learning Research",
                                  "Natural Language Engineering"))
            vol, num, p2 = rng.randint(1, 50), rng.randint(1, 4), p1 + rng.randint(10, 30)
            refs.append(f"{authors}. {y}. {title}. {journal} , {vol}({num}):{p1}–{p2}.")
    return tuple(refs)


def _build_code(rng: random.Random, n: int) -> tuple[tuple[str, str], ...]:
    out = []
    for _ in range(n):
        lang, body = rng.choice(_CODE_SNIPPETS)
        subs = {
            "@tab@": str(rng.randint(1, 8)), "@lr@": rng.choice(_SLOT_POOLS["lr"]),
            "@warm@": str(rng.choice((500, 1000, 2000, 4000))), "@hid@": rng.choice(("256", "512", "768", "1024")),
            "@prec@": str(rng.randint(1, 4)), "@dset@": rng.choice(DATASETS),
            "@model@": rng.choice(MODELS).lower().replace(" ", "-"), "@bs@": rng.choice(_SLOT_POOLS["bs"]),
            "@epochs@": str(rng.randint(2, 30)), "@seed@": str(rng.randint(0, 9999)),
            "@drop@": str(rng.randint(1, 5)), "@hexid@": f"{rng.getrandbits(48):012x}",
            "@unit@": rng.choice(_SLOT_POOLS["unit"]),
            "@label@": rng.choice(("positive", "negative", "neutral", "entailment", "SUPPORTS", "REFUTES")),
            "@num@": rng.choice(_SLOT_POOLS["num"]), "@sec@": str(rng.randint(3, 5)),
            "@slug@": _ascii(rng.choice(DATASETS)).lower().replace(" ", "_").replace("/", "_"),
            "@maxlen@": str(rng.choice((512, 1024, 2048))), "@pct@": str(rng.randint(5, 20)),
        }
        for k, v in subs.items():
            body = body.replace(k, v)
        out.append((lang, body))
    return tuple(out)


_POOL_RNG = random.Random(20240607)
_SENTS = _build_sentence_pools(_POOL_RNG)
_REFS = _build_refs(_POOL_RNG, 3000)
_CODE = _build_code(_POOL_RNG, 400)
_NUMS = tuple(f"{x / 10:.1f}" for x in range(50, 1000))
_PARA_K_SHORT = (2, 2, 3, 3, 3, 4, 4, 5)
_PARA_K = tuple(k for k, w in zip(range(2, 13), (6, 10, 12, 12, 11, 9, 7, 5, 4, 3, 2), strict=True) for _ in range(w))


def _placeholder_rates() -> dict[str, float]:
    total = 0
    counts = dict.fromkeys(_PP.values(), 0)
    for kind in ("intro", "related", "method", "setup", "results", "analysis", "conclusion"):
        for group in _SENTS[kind]:
            for s in group[:30]:
                total += len(s)
                if "\x01" in s:
                    for tok in counts:
                        counts[tok] += s.count(tok)
    return {tok: c / total for tok, c in counts.items()}


_RATES = _placeholder_rates()
_ETAL = tuple(f"{_POOL_RNG.choice(SURNAMES)} et al. ({_POOL_RNG.randint(2015, 2024)})" for _ in range(400))


def _sentences(rng: random.Random, kind: str, k: int) -> list[str]:
    """``k`` sentences of a section kind, from distinct templates when possible."""
    groups = _SENTS[kind]
    n = len(groups)
    idx = rng.sample(range(n), k) if k <= n else rng.choices(range(n), k=k)
    rnd = rng.random
    out = []
    for i in idx:
        g = groups[i]
        out.append(g[int(rnd() * len(g))])
    return out


def _sentence(rng: random.Random, kind: str) -> str:
    return rng.choice(rng.choice(_SENTS[kind]))


# ---------------------------------------------------------------------------
# Seeds, ids and sizes.
# ---------------------------------------------------------------------------

def _derive(seed: int, index: int, salt: str) -> int:
    h = hashlib.blake2b(f"{seed}/{index}/{salt}".encode(), digest_size=16).digest()
    return int.from_bytes(h, "little")


def sample_target_chars(rng: random.Random) -> int:
    """Draw a paper length (characters): median ~37k, p90 ~74k, p99 ~162k, in [2k, 400k]."""
    z = rng.gauss(0.0, 1.0)
    if z <= _Z90:
        x = _SIGMA_BODY * z
    else:
        x = _SIGMA_BODY * _Z90 + _SIGMA_TAIL * (z - _Z90)
    return int(min(SIZE_MAX, max(SIZE_MIN, SIZE_MEDIAN * math.exp(x))))


def target_chars_for(seed: int, index: int) -> int:
    """The target length ``generate_paper(seed, index)`` uses when none is given."""
    return sample_target_chars(random.Random(_derive(seed, index, "size")))


_NEW_VENUES = (
    ("acl-long", "ACL"), ("acl-long", "ACL"), ("acl-short", "ACL"), ("acl-demo", "ACL"),
    ("acl-srw", "ACL"), ("emnlp-main", "EMNLP"), ("emnlp-main", "EMNLP"), ("emnlp-demo", "EMNLP"),
    ("emnlp-industry", "EMNLP"), ("naacl-main", "NAACL"), ("naacl-long", "NAACL"),
    ("eacl-main", "EACL"), ("findings-acl", "Findings"), ("findings-emnlp", "Findings"),
    ("coling-main", "COLING"), ("conll-1", "CoNLL"), ("wmt-1", "WMT"), ("semeval-1", "SemEval"),
    ("bionlp-1", "BioNLP"), ("repl4nlp-1", "RepL4NLP"), ("tacl-1", "TACL"), ("lrec-1", "LREC"),
    ("bea-1", "BEA"), ("wnut-1", "WNUT"),
)
_OLD_VENUES = (("P", "ACL"), ("P", "ACL"), ("D", "EMNLP"), ("N", "NAACL"), ("E", "EACL"),
               ("C", "COLING"), ("W", "WS"), ("W", "WS"), ("Q", "TACL"), ("J", "CL"),
               ("K", "CoNLL"), ("S", "SemEval"), ("L", "LREC"))
_ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth",
             "Ninth", "Tenth", "11th", "12th", "13th", "14th", "15th", "16th", "17th", "18th")


def _paper_id(rng: random.Random, index: int) -> tuple[str, int, str]:
    """(paper_id, year, venue); the numeric part encodes ``index`` so ids are unique per seed."""
    if index < 10_000 and rng.random() < 0.3:
        letter, venue = rng.choice(_OLD_VENUES)
        year = rng.randint(2000, 2019)
        return f"{letter}{year % 100:02d}-{index:04d}", year, venue
    key, venue = rng.choice(_NEW_VENUES)
    year = rng.randint(2020, 2024)
    return f"{year}.{key}.{index + 1}", year, venue


# ---------------------------------------------------------------------------
# Paper builder.
# ---------------------------------------------------------------------------

class _Builder:
    def __init__(self, rng: random.Random, index: int, target: int, *,
                 allow_code: bool = True, allow_tables: bool = True) -> None:
        self.rng = rng
        self.index = index
        self.target = max(1, int(target))
        self.parts: list[str] = []
        self.section_starts: list[int] = []  # indexes in parts of ``## N ...`` headings
        self.tab_n = 0
        self.fig_n = 0
        r = rng.random
        self.allow_tables = allow_tables
        self.has_code = allow_code and r() < 0.3
        self.code_pending = self.has_code
        self.has_formula = r() < 0.6
        self.formula_pending = self.has_formula
        self.h56 = r() < 0.25
        self.h56_pending = self.h56
        self.flat = (not self.h56) and r() < 0.2
        self.deep = r() < 0.4
        self.long_paras = r() < 0.3
        self.bullets = r() < 0.5
        self.numbered_lists = r() < 0.3
        self.caption_after = rng.choice((0.0, 0.0, 0.15, 0.3, 0.6))
        self.padded_tables = r() < 0.7
        self.table_mult = rng.choice((0.5, 1.0, 1.0, 1.5, 2.0))
        self.refs_as_list = r() < 0.15
        self.table_pending = allow_tables and self.target >= 8000
        self.debt = 0.0
        self.para_k = _PARA_K if self.target >= 15_000 else _PARA_K_SHORT
        self._terms()

    # -- per-paper vocabulary ------------------------------------------------
    def _terms(self) -> None:
        rng = self.rng
        method = rng.choice(_SYL1) + rng.choice(_SYL2) + rng.choice(_SUFFIX) + rng.choice(_VERSION)
        adj = rng.choice(ADJS)
        desc = ("an " if adj[0] in "aeiou" else "a ") + adj + " " + rng.choice(ARCHS)
        task = rng.choice(TASKS)
        if rng.random() < 0.5:
            ds1 = rng.choice(_SYL1) + rng.choice(_SYL2) + rng.choice(_DS_SUFFIX)
        else:
            ds1 = rng.choice(DATASETS)
        ds2 = rng.choice(DATASETS)
        if ds2 == ds1:
            ds2 = rng.choice(_SYL1) + rng.choice(_SYL2) + rng.choice(_DS_SUFFIX)
        baseline = rng.choice(MODELS) if rng.random() < 0.6 else (
            rng.choice(_SYL1) + rng.choice(_SYL2) + rng.choice(_SUFFIX))
        self.t = {
            "M": method, "m": desc, "T": task, "Tc": task[0].upper() + task[1:], "D": ds1,
            "E": ds2, "K": rng.choice(METRICS), "B": baseline,
            "C": rng.choice(COMPONENT_ADJ) + " " + rng.choice(COMPONENTS),
            "A": rng.choice(DOMAINS), "L": rng.choice(LANGS),
        }
        self.f = 1.0 + sum(_RATES[_PP[k]] * (len(v) - 2) for k, v in self.t.items())

    def _fill_terms(self, s: str) -> str:
        """Replace the per-paper tokens (``\\x01`` + letter) in one pass."""
        if "\x01" not in s:
            return s
        m = {_PP[k][1]: v for k, v in self.t.items()}
        pieces = s.split("\x01")
        return pieces[0] + "".join([m[p[0]] + p[1:] for p in pieces[1:]])

    # -- elements ------------------------------------------------------------
    def _heading(self, level: int, text: str) -> None:
        if self.flat and level <= 4:
            level = 2
        self.parts.append("#" * level + " " + text)

    def _para(self, kind: str, long: bool = False) -> float:
        rng = self.rng
        k = rng.randint(16, 30) if long else rng.choice(self.para_k)
        p = " ".join(_sentences(rng, kind, k))
        self.parts.append(p)
        return len(p) * self.f + 2

    def _list(self, kind: str) -> float:
        rng = self.rng
        items = _sentences(rng, kind, rng.randint(3, 7))
        if self.numbered_lists and rng.random() < 0.5:
            s = "\n".join(f"{i}. {x}" for i, x in enumerate(items, 1))
        else:
            s = "\n".join("- " + x for x in items)
        self.parts.append(s)
        return len(s) * self.f + 2

    def _formula(self) -> float:
        self.formula_pending = False
        n = 30
        self.parts.append("<!-- formula-not-decoded -->")
        if self.rng.random() < 0.6:
            w = _sentence(self.rng, "where")
            self.parts.append(w)
            n += len(w) * self.f + 2
        return n

    def _figure(self) -> float:
        rng = self.rng
        self.fig_n += 1
        text = rng.choice(_FIG_CAPTIONS).format(
            M=_PP["M"], C=_PP["C"], K=_PP["K"], D=_PP["D"], E=_PP["E"], B=_PP["B"],
            hyper=rng.choice(_SLOT_POOLS["hyper"]))
        cap = f"Figure {self.fig_n}: {text}"
        if rng.random() < 0.3:
            cap += " " + _sentence(rng, "results")
        self.parts.append("<!-- image -->")
        self.parts.append(cap)
        return 16 + len(cap) * self.f + 2

    def _code(self) -> float:
        rng = self.rng
        self.code_pending = False
        lang, body = rng.choice(_CODE)
        fence = "~~~" if rng.random() < 0.2 else "```"
        tag = "" if rng.random() < 0.1 else lang
        s = f"{fence}{tag}\n{body}\n{fence}"
        self.parts.append(s)
        return len(s) + 2

    def _table_rows(self, kind: str, max_chars: float) -> tuple[list[str], list[list[str]], bool]:
        """Header, rows (first column text) and whether numeric columns right-align."""
        rng = self.rng
        t = self.t
        if kind == "stats":
            header = ["Dataset", "Train", "Dev", "Test", "Avg. len."][: rng.randint(3, 5)]
            names = [t["D"], t["E"]] + rng.sample(DATASETS, 6)
            width = 14 + 10 * len(header)
            n = max(3, min(rng.randint(3, 8), int(max_chars // width)))
            rows = [[names[i % len(names)]] + [f"{rng.randint(200, 250000):,}" for _ in header[1:-1]]
                    + [f"{rng.randint(80, 9000) / 10:.1f}"] for i in range(n)]
            return header, rows, True
        if kind == "hyper":
            hp = (("Learning rate", _SLOT_POOLS["lr"]), ("Batch size", _SLOT_POOLS["bs"]),
                  ("Dropout", ("0.1", "0.2", "0.3")), ("Warmup steps", ("500", "1,000", "4,000")),
                  ("Max. sequence length", _SLOT_POOLS["maxlen"]), ("Epochs", _SLOT_POOLS["int"]),
                  ("Optimizer", ("AdamW", "Adafactor", "Adam")), ("Weight decay", ("0.01", "0.0", "0.1")),
                  ("Beam size", _SLOT_POOLS["beam"]), ("Label smoothing", ("0.1", "0.0")),
                  ("Temperature τ", ("0.05", "0.07", "1.0")), ("Gradient clipping", _SLOT_POOLS["clip"]),
                  ("Hidden size", _SLOT_POOLS["hid"]), ("Seeds", ("3", "5")))
            n = max(3, min(rng.randint(4, len(hp)), int(max_chars // 36)))
            return ["Hyperparameter", "Value"], [[a, rng.choice(b)] for a, b in hp[:n]], False
        if kind == "lang":
            header = ["Language", t["B"], t["M"]] + (["Δ"] if rng.random() < 0.5 else [])
            pool = list(LANGS)
            n = max(3, min(rng.randint(6, 24), int(max_chars // (12 + 9 * len(header)))))
            langs = rng.sample(pool, min(n, len(pool)))
            rows = []
            for lg in langs:
                a, b = rng.choice(_NUMS), rng.choice(_NUMS)
                row = [lg, a, b]
                if len(header) == 4:
                    row.append(f"{float(b) - float(a):+.1f}")
                rows.append(row)
            return header, rows, True
        # results / ablation
        if kind == "ablation":
            header = ["Model", t["K"]] + rng.sample(["Precision", "Recall", "Δ", "Dev", "Test"], rng.randint(0, 3))
            names = [t["M"], f"w/o {t['C']}", "w/o pretraining", "w/o data augmentation",
                     f"w/o {rng.choice(ADJS)} loss", "+ ensemble", "random initialization",
                     "frozen encoder"]
        else:
            cols = [t["D"], t["E"]] + rng.sample(DATASETS, 4) + [_ascii(t["K"]) or t["K"], "Avg."]
            header = [rng.choice(("Model", "Method", "System"))] + rng.sample(cols, rng.randint(2, 7))
            names = [t["B"]] + rng.sample(MODELS, 10) + [
                f"{t['M']} (ours, single)", f"{t['M']} (ours)",
                f"{t['M']} + {rng.choice(_SLOT_POOLS['adaptation'])}"] + rng.sample(_ETAL, 20)
        width = 16 + 8 * len(header)
        n = max(3, min(rng.randint(3, 30), int(max_chars // width), len(names)))
        chosen = names[:n] if kind == "ablation" else rng.sample(names[1:], n - 1) + [names[0]]
        ncol = len(header) - 1
        cells = rng.choices(_NUMS, k=n * ncol)
        rows = []
        rnd = rng.random
        for i, name in enumerate(chosen):
            row = [name] + cells[i * ncol:(i + 1) * ncol]
            r = rnd()
            if r < 0.23:
                j = 1 + int(rnd() * ncol)
                if r < 0.08:
                    row[j] = "-"
                elif r < 0.12:
                    row[j] = ""
                else:
                    row[j] = f"{row[j]} ± 0.{1 + int(r * 40)}"
            rows.append(row)
        return header, rows, True

    def _render_table(self, header: list[str], rows: list[list[str]], right: bool) -> str:
        if not self.padded_tables:
            lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            return "\n".join(lines)
        widths = [max(map(len, col)) for col in zip(header, *rows, strict=True)]
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        for r in rows:
            cells = [r[0].ljust(widths[0])]
            cells += [(c.rjust(w) if right else c.ljust(w)) for c, w in zip(r[1:], widths[1:], strict=True)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def _table(self, section_kind: str, max_chars: float) -> float:
        rng = self.rng
        self.table_pending = False
        if section_kind == "setup":
            kind = rng.choice(("stats", "stats", "hyper", "results"))
        elif section_kind == "analysis":
            kind = rng.choice(("ablation", "ablation", "results", "lang"))
        elif section_kind == "appendix":
            kind = rng.choice(("hyper", "lang", "results", "stats", "ablation"))
        else:
            kind = rng.choice(("results", "results", "results", "lang", "ablation"))
        header, rows, right = self._table_rows(kind, max_chars)
        table = self._render_table(header, rows, right)
        self.tab_n += 1
        ckind = kind if kind in _TABLE_CAPTIONS else "results"
        text = rng.choice(_TABLE_CAPTIONS[ckind]).format(
            M=_PP["M"], C=_PP["C"], K=_PP["K"], D=_PP["D"], E=_PP["E"], B=_PP["B"], T=_PP["T"],
            unit=rng.choice(_SLOT_POOLS["unit"]))
        cap = f"Table {self.tab_n}: {text}"
        if rng.random() < 0.25:
            cap += " " + _sentence(rng, "results")
        if rng.random() < self.caption_after:
            self.parts.append(table)
            self.parts.append(cap)
        else:
            self.parts.append(cap)
            self.parts.append(table)
        return len(table) + len(cap) * self.f + 4

    def _h56(self, kind: str, budget: float) -> float:
        self.h56_pending = False
        rng = self.rng
        used = 0.0
        for _ in range(rng.randint(1, 3)):
            self.parts.append("#" * rng.choice((5, 5, 6)) + " " + rng.choice(_H56_TITLES))
            used += 20 + self._para(kind)
            if used >= budget:
                break
        return used

    _TABLE_P = {"results": 0.3, "analysis": 0.2, "setup": 0.15, "appendix": 0.2, "method": 0.03}
    _FIG_P = {"method": 0.1, "analysis": 0.12, "results": 0.08, "intro": 0.04, "appendix": 0.1}

    def _fill(self, kind: str, budget: float) -> None:
        """Append elements of a section body until ``budget`` (final characters) is used."""
        rng = self.rng
        budget -= self.debt  # carry over the overshoot (or shortfall) of earlier sections
        used = self._para(kind)
        p_table = self._TABLE_P.get(kind, 0.0) * self.table_mult if self.allow_tables else 0.0
        p_fig = self._FIG_P.get(kind, 0.0)
        p_formula = 0.15 if self.has_formula and kind in ("method", "appendix", "setup") else 0.0
        p_code = 0.1 if self.has_code and kind in ("method", "setup", "appendix") else 0.0
        p_list = 0.06 if self.bullets else 0.0
        p_long = 0.12 if self.long_paras else 0.0
        h56_here = kind in ("setup", "method", "results", "appendix")
        while used < budget:
            rem = budget - used
            if self.h56_pending and h56_here:
                used += self._h56(kind, rem)
                continue
            if self.code_pending and p_code:
                used += self._code()
                continue
            if self.formula_pending and p_formula:
                used += self._formula()
                continue
            if self.table_pending and p_table and rem > 400:
                used += self._table(kind, max(400.0, min(rem, 12_000.0)))
                continue
            r = rng.random()
            if r < p_table:
                if rem > 500:
                    used += self._table(kind, max(400.0, min(rem, 15_000.0)))
                    continue
                r = 1.0
            r -= p_table
            if r < p_fig:
                used += self._figure()
                continue
            r -= p_fig
            if r < p_formula:
                used += self._formula()
                continue
            r -= p_formula
            if r < p_code:
                used += self._code()
                continue
            r -= p_code
            if r < p_list:
                used += self._list(kind)
                continue
            r -= p_list
            used += self._para(kind, long=r < p_long and rem > 1500)
        self.debt = used - budget

    def _subtitles(self, kind: str, n: int) -> list[str]:
        rng = self.rng
        pool = _SUBTITLES.get(kind, _SUBTITLES["analysis"])
        out = rng.sample(pool, min(n, len(pool)))
        while len(out) < n:
            out.append(rng.choice(("Effect of ", "Analysis of ", "Impact of ", "Varying the "))
                       + rng.choice(_SUBTITLE_NOUNS))
        return out

    def _section(self, num: str, title: str, kind: str, budget: float) -> None:
        rng = self.rng
        self.section_starts.append(len(self.parts))
        self._heading(2, f"{num} {title}" if num else title)
        used = len(title) + 6
        budget -= used
        nsub = 0
        if kind in _SUBTITLES and budget > 3000:
            nsub = int(budget / rng.uniform(1800, 6000))
            if nsub == 1:
                nsub = 2 if rng.random() < 0.5 else 0
            nsub = min(nsub, 40)
        if nsub == 0:
            self._fill(kind, budget)
            return
        lead = budget * rng.uniform(0.05, 0.2) if rng.random() < 0.7 else 0.0
        if lead:
            self._fill(kind, lead)
        per = (budget - lead) / nsub
        for i, st in enumerate(self._subtitles(kind, nsub), 1):
            snum = f"{num}.{i}" if num else ""
            self._heading(3, f"{snum} {st}".strip())
            if self.deep and per > 2500 and rng.random() < 0.6:
                nss = rng.randint(2, max(2, min(5, int(per / 1500))))
                lead2 = per * 0.15 if rng.random() < 0.5 else 0.0
                if lead2:
                    self._fill(kind, lead2)
                for j, sst in enumerate(self._subtitles(kind, nss), 1):
                    self._heading(4, f"{snum}.{j} {sst}".strip() if snum else sst)
                    self._fill(kind, (per - lead2) / nss - 20)
            else:
                self._fill(kind, per - 20)

    # -- whole paper ----------------------------------------------------------
    def _front(self) -> tuple[str, list[str]]:
        rng = self.rng
        t = self.t
        title = _title_case(rng.choice(_TITLE_TEMPLATES).format(
            M=t["M"], Adj=rng.choice(ADJS), Arch=rng.choice(ARCHS), Task=t["T"],
            Adaptation=rng.choice(_SLOT_POOLS["adaptation"]), Noun=rng.choice(NOUNS),
            Model=rng.choice(MODELS), Domain=t["A"], Lang=t["L"], D=t["D"]))
        if title[:1].islower():
            title = title[0].upper() + title[1:]
        n = rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5, 6, 8))
        authors = []
        while len(authors) < n:
            a = f"{rng.choice(GIVEN)} {rng.choice(SURNAMES)}"
            if a not in authors:
                authors.append(a)
        cities = rng.sample(CITIES, rng.randint(1, min(3, n)))
        affs = []
        for c in cities:
            r = rng.random()
            if r < 0.5:
                affs.append(f"University of {c}, {COUNTRIES[c]}")
            elif r < 0.7:
                affs.append(f"Department of Computer Science, {c} Institute of Technology")
            elif r < 0.85:
                affs.append(f"{rng.choice(COMPANIES)}, {c}")
            else:
                affs.append(f"{c} Center for Language Technology")
        self.parts.append("## " + title)
        emails = []
        for i, a in enumerate(authors):
            user = _ascii(a.split()[0][0] + "." + a.split()[-1]).lower().replace("’", "")
            emails.append(f"{user}@{_ascii(cities[i % len(cities)]).lower()}.edu")
        if rng.random() < 0.5:
            # one block per author: name, affiliation, (email) as separate paragraphs
            with_email = rng.random() < 0.6
            for i, a in enumerate(authors):
                self.parts.append(a)
                self.parts.append(affs[i % len(affs)])
                if with_email:
                    self.parts.append(emails[i])
        else:
            marks = [str(1 + i % len(affs)) for i in range(len(authors))]
            self.parts.append(" , ".join(f"{a} {m}" for a, m in zip(authors, marks, strict=True)))
            self.parts.append(" ".join(f"{i + 1} {aff}" for i, aff in enumerate(affs)))
            if rng.random() < 0.7:
                self.parts.append(" , ".join(emails))
        return title, authors

    def build(self) -> tuple[str, list[str]]:
        rng = self.rng
        target = self.target
        title, authors = self._front()
        self.parts.append("## Abstract")
        ab_k = rng.randint(5, 9) if target >= 8000 else rng.randint(2, 4)
        self.parts.append(" ".join(_sentences(rng, "intro", ab_k)))
        front = sum(len(p) + 2 for p in self.parts) * self.f

        # References first so we know their size.
        if target >= 8000:
            nref = int(target * rng.uniform(0.08, 0.16) / 190)
            nref = min(60, max(10, nref))
        else:
            nref = rng.randint(3, 8)
        refs = sorted(rng.sample(_REFS, nref))
        if self.refs_as_list:
            ref_part = ["\n".join("- " + r for r in refs)]
        else:
            ref_part = refs
        refs_len = sum(len(r) + 2 for r in ref_part) + 14

        body = max(600.0, target - front - refs_len)
        appendix = 0.0
        if target >= 8000 and rng.random() < (0.4 if target < 100_000 else 0.9):
            appendix = body * (rng.uniform(0.08, 0.25) if target < 100_000 else rng.uniform(0.2, 0.4))
        main = body - appendix

        method_title = rng.choice(("Method", "Approach", "Model", _PP["M"], "Proposed Method",
                                   "Methodology", f"{_PP['M']}: Overview"))
        secs = [("intro", "Introduction", 0.13),
                ("related", rng.choice(("Related Work", "Background", "Related Work and Background")), 0.10),
                ("method", method_title, 0.22),
                ("setup", rng.choice(("Experimental Setup", "Experiments", "Experimental Settings")), 0.12),
                ("results", rng.choice(("Results", "Main Results", "Results and Discussion")), 0.16),
                ("analysis", rng.choice(("Analysis", "Discussion", "Further Analysis",
                                         "Ablation Study and Analysis")), 0.15),
                ("conclusion", rng.choice(("Conclusion", "Conclusions", "Conclusion and Future Work")), 0.04)]
        if target < 12_000:
            secs = [s for s in secs if s[0] not in ("related", "analysis")]
        elif rng.random() < 0.3:  # related work just before the conclusion
            rel = secs.pop(1)
            secs.insert(len(secs) - 1, rel)
        tail = []
        if target >= 8000:
            if rng.random() < 0.6:
                tail.append(("limitations", "Limitations", 0.03))
            if rng.random() < 0.25:
                tail.append(("limitations", "Ethics Statement", 0.02))
            if rng.random() < 0.5:
                tail.append(("conclusion", rng.choice(("Acknowledgments", "Acknowledgements")), 0.01))
        wsum = sum(w for _, _, w in secs + tail)
        for i, (kind, stitle, w) in enumerate(secs, 1):
            self._section(str(i), stitle, kind, main * w / wsum)
        for kind, stitle, w in tail:
            self.section_starts.append(len(self.parts))
            self._heading(2, stitle)
            if kind == "conclusion":
                self._para("conclusion")
            else:
                self._fill(kind, main * w / wsum)

        self.section_starts.append(len(self.parts))
        self.parts.append("## References")
        self.parts.extend(ref_part)

        if appendix:
            nsec = max(1, min(26, int(appendix / rng.uniform(4000, 12000))))
            titles = list(_APPENDIX_TITLES)
            rng.shuffle(titles)
            if rng.random() < 0.5:
                titles.remove("Appendix")
                titles.insert(0, "Appendix")
            while len(titles) < nsec:
                titles.append("Additional " + rng.choice(_SUBTITLE_NOUNS) + " Results")
            for i in range(nsec):
                self._section(chr(ord("A") + i), titles[i], "appendix", appendix / nsec)
        return title, authors

    def render(self) -> str:
        return self._fill_terms("\n\n".join(self.parts)) + "\n"


def _metadata(rng: random.Random, paper_id: str, year: int, venue: str, title: str,
              authors: list[str]) -> dict:
    lang = "en" if rng.random() < 0.95 else rng.choice(("de", "fr", "es", "pt", "zh", "ja", "ru"))
    return {"paper_id": paper_id, "title": title, "authors": list(authors), "year": year,
            "venue": venue, "url": f"https://aclanthology.org/{paper_id}", "language": lang}


def _volume(rng: random.Random, index: int, year: int, venue: str, target: int) -> tuple[str, str]:
    """Front matter of a proceedings volume (no authors)."""
    b = _Builder(rng, index, target)
    topic = _title_case(rng.choice(ADJS) + " " + b.t["T"])
    title = f"Proceedings of the {rng.choice(_ORDINALS)} Workshop on {topic}"
    parts = ["## " + title, f"{venue} {year}", "## Preface"]
    parts += [b._fill_terms(" ".join(_sentences(rng, "intro", rng.randint(3, 7))))
              for _ in range(rng.randint(2, 4))]
    parts.append("## Organizing Committee")
    parts.append("\n".join(f"- {rng.choice(GIVEN)} {rng.choice(SURNAMES)}, University of {rng.choice(CITIES)}"
                           for _ in range(rng.randint(3, 8))))
    parts.append("## Table of Contents")
    size = sum(len(p) + 2 for p in parts)
    page = 1
    toc = []
    while size < target:
        entry = rng.choice(_REFS).split(". ")
        line = f"{entry[2] if len(entry) > 2 else entry[0]} {entry[0]} . . . . . {page}"
        page += rng.randint(6, 14)
        toc.append(line)
        size += len(line) + 2
    parts.extend(toc)
    return title, "\n\n".join(parts) + "\n"


def _make_builder(seed: int, index: int, target: int, salt: str, **opts) -> _Builder:
    return _Builder(random.Random(_derive(seed, index, salt)), index, target, **opts)


def generate_paper(seed: int, index: int, target_chars: int | None = None) -> SyntheticPaper:
    """One paper, a pure function of ``(seed, index, target_chars)``."""
    if target_chars is None:
        target_chars = target_chars_for(seed, index)
    rng = random.Random(_derive(seed, index, "paper"))
    paper_id, year, venue = _paper_id(rng, index)
    if rng.random() < 0.02:
        title, md = _volume(rng, index, year, venue, target_chars)
        return SyntheticPaper(paper_id, md, _metadata(rng, paper_id, year, venue, title, []))
    b = _Builder(rng, index, target_chars)
    title, authors = b.build()
    md = b.render()
    return SyntheticPaper(paper_id, md, _metadata(rng, paper_id, year, venue, b._fill_terms(title), authors))


def iter_corpus(n: int, seed: int = 0, *, max_chars: int | None = None, start: int = 0) -> Iterator[SyntheticPaper]:
    """Papers ``start .. start+n-1`` of the corpus for ``seed``; ``max_chars`` caps sampled sizes."""
    for i in range(start, start + n):
        t = target_chars_for(seed, i)
        if max_chars is not None:
            t = min(t, max_chars)
        yield generate_paper(seed, i, t)


# ---------------------------------------------------------------------------
# Writers.
# ---------------------------------------------------------------------------

def write_corpus(out_dir, n: int | None = None, seed: int = 0, fmt: str = "md",
                 total_bytes: int | None = None, shard_size: int = 1000, metadata: bool = True,
                 *, max_chars: int | None = None) -> dict:
    """Write a corpus; stops after ``n`` papers or once ``total_bytes`` of UTF-8 markdown are written.

    ``md``: ``out_dir/<paper_id>.md``; ``parquet``: ``out_dir/part-NNNNN.parquet`` with columns
    ``anthology_id`` (string) and ``markdown`` (large_string); ``jsonl``: ``out_dir/part-NNNNN.jsonl``.
    ``metadata=True`` also writes ``out_dir/metadata.jsonl`` (one metadata object per line).
    """
    if fmt not in ("md", "parquet", "jsonl"):
        raise ValueError(f"unknown format {fmt!r}")
    if n is None and total_bytes is None:
        raise ValueError("give n or total_bytes")
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    meta_path = out / "metadata.jsonl"
    meta_f = open(meta_path, "w", encoding="utf-8", newline="") if metadata else None
    papers = 0
    nbytes = 0
    shard_ids: list[str] = []
    shard_md: list[str] = []

    def flush() -> None:
        if not shard_ids:
            return
        k = len(files)
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            path = out / f"part-{k:05d}.parquet"
            table = pa.table({"anthology_id": pa.array(shard_ids, pa.string()),
                              "markdown": pa.array(shard_md, pa.large_string())})
            pq.write_table(table, path, row_group_size=256)
        else:
            path = out / f"part-{k:05d}.jsonl"
            with open(path, "w", encoding="utf-8", newline="") as f:
                for pid, md in zip(shard_ids, shard_md, strict=True):
                    f.write(json.dumps({"anthology_id": pid, "markdown": md}, ensure_ascii=False) + "\n")
        files.append(str(path))
        shard_ids.clear()
        shard_md.clear()

    try:
        i = 0
        while True:
            if n is not None and papers >= n:
                break
            if total_bytes is not None and nbytes >= total_bytes:
                break
            t = target_chars_for(seed, i)
            if max_chars is not None:
                t = min(t, max_chars)
            p = generate_paper(seed, i, t)
            i += 1
            data = p.markdown.encode("utf-8")
            nbytes += len(data)
            papers += 1
            if fmt == "md":
                path = out / f"{p.paper_id}.md"
                with open(path, "wb") as f:
                    f.write(data)
                files.append(str(path))
            else:
                shard_ids.append(p.paper_id)
                shard_md.append(p.markdown)
                if len(shard_ids) >= shard_size:
                    flush()
            if meta_f is not None:
                meta_f.write(json.dumps(p.metadata, ensure_ascii=False) + "\n")
        flush()
    finally:
        if meta_f is not None:
            meta_f.close()
    return {"papers": papers, "bytes": nbytes, "files": files,
            "metadata": str(meta_path) if metadata else None}


BAD_CASES = ("empty", "whitespace_only", "invalid_utf8", "nul_bytes", "binary_junk",
             "huge_single_line", "crlf", "unclosed_fence", "huge_table", "duplicate_id")
# Cases that are well-formed papers a pipeline must process normally.
GOOD_CASES = ("crlf", "unclosed_fence", "huge_table", "duplicate_id")


def _insert_at_spaces(data: bytes, junk: list[bytes], rng: random.Random) -> bytes:
    """Insert byte strings right after randomly chosen ASCII spaces (never inside a UTF-8 char)."""
    spaces = [i for i in range(len(data)) if data[i] == 0x20] if len(data) < 2_000_000 else []
    if not spaces:
        return data + b"".join(junk)
    pos = sorted(rng.sample(spaces, min(len(junk), len(spaces))))
    out, prev = [], 0
    for p, j in zip(pos, junk, strict=False):
        out.append(data[prev:p + 1])
        out.append(j)
        prev = p + 1
    out.append(data[prev:])
    return b"".join(out)


def write_bad_inputs(out_dir, seed: int = 0, big_bytes: int = 50 * 1024 * 1024) -> dict[str, str]:
    """Write one pathological (or unusual but valid) ``.md`` file per case; returns ``{case: stem}``.

    Stems are ``case-<case-with-dashes>``; ``duplicate_id`` has a second, different file with
    the same stem at ``out_dir/dup/<stem>.md``.  Cases listed in ``GOOD_CASES`` are valid papers.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(_derive(seed, 0, "bad-inputs"))
    stems = {c: "case-" + c.replace("_", "-") for c in BAD_CASES}

    def paper(salt: str, target: int = 12_000, **opts) -> _Builder:
        b = _make_builder(seed, 0, target, salt, **opts)
        b.build()
        return b

    def put(case: str, data: bytes, sub: str | None = None) -> None:
        d = out / sub if sub else out
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"{stems[case]}.md", "wb") as f:
            f.write(data)

    put("empty", b"")
    put("whitespace_only", b"   \n\n\t  \n \r\n\n      \t\n\n")

    data = paper("bad-invalid").render().encode("utf-8")
    junk = [b"\xff\xfe", b"\xe2\x80", b"\xc3", b"\xff\xfe\xfd", b"\xf0\x9f\x98"]  # incl. truncated chars
    put("invalid_utf8", _insert_at_spaces(data, junk, rng))

    data = paper("bad-nul").render().encode("utf-8")
    put("nul_bytes", _insert_at_spaces(data, [b"\x00", b"\x00\x00", b"\x00", b"\x00" * 8], rng))

    put("binary_junk", b"\x89PNG\r\n\x1a\n" + rng.randbytes(64 * 1024))

    # One line of big_bytes bytes: a ~1 MB block built once, repeated with a varying marker.
    b = paper("bad-line", target=60_000)
    text = b.render().replace("\r", " ").replace("\n", " ")
    unit = text.encode("utf-8")
    block = unit * max(1, (1 << 20) // len(unit))
    pieces, size, k = [], 0, 0
    while size < big_bytes:
        piece = f" [segment {k}] ".encode() + block
        pieces.append(piece)
        size += len(piece)
        k += 1
    line = b"".join(pieces)[:big_bytes]
    line = line.decode("utf-8", errors="ignore").encode("utf-8")
    line += b" " * (big_bytes - len(line))
    put("huge_single_line", line)

    put("crlf", paper("bad-crlf").render().replace("\n", "\r\n").encode("utf-8"))

    b = paper("bad-fence", target=15_000, allow_code=False)
    mid = b.section_starts[len(b.section_starts) // 2]
    b.parts.insert(mid, "```python\n# this fence is opened and never closed\nfor step in range(10):\n"
                        "    loss = train_step(step)")
    put("unclosed_fence", b.render().encode("utf-8"))

    b = paper("bad-table", target=15_000, allow_tables=False)
    b.padded_tables = True
    header = ["Language", "System", "Dev " + _ascii(b.t["K"]), "Test " + _ascii(b.t["K"]), "Δ"]
    trows, size = [], 0
    while size < 300_000:
        row = [f"{rng.choice(LANGS)}-{len(trows)}", rng.choice(MODELS), rng.choice(_NUMS),
               rng.choice(_NUMS), f"{rng.uniform(-5, 5):+.1f}"]
        trows.append(row)
        size += sum(len(c) for c in row) + 20
    table = b._render_table(header, trows, True)
    trows = trows[: max(3, int(len(trows) * 300_000 / len(table)))]  # ~300 KB of table
    mid = b.section_starts[len(b.section_starts) // 2]
    b.parts[mid + 1:mid + 1] = [
        "Table 3: Full per-language results for all systems (development and test).",
        b._render_table(header, trows, True)]
    put("huge_table", b.render().encode("utf-8"))

    put("duplicate_id", paper("bad-dup-a").render().encode("utf-8"))
    put("duplicate_id", paper("bad-dup-b").render().encode("utf-8"), sub="dup")
    return stems


# ---------------------------------------------------------------------------
# CLI.
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verbatim_synth",
                                 description="Generate a synthetic docling-style paper corpus.")
    ap.add_argument("--out", required=True, help="output directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--n", type=int, help="number of papers")
    g.add_argument("--total-mb", type=float, help="generate until this many MB (2^20 bytes) of markdown")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("md", "parquet", "jsonl"), default="md")
    ap.add_argument("--shard-size", type=int, default=1000, help="papers per parquet/jsonl shard")
    ap.add_argument("--max-chars", type=int, default=None, help="cap on sampled paper sizes")
    ap.add_argument("--no-metadata", action="store_true")
    ap.add_argument("--bad", action="store_true", help="also write pathological inputs into OUT/bad")
    ap.add_argument("--bad-big-mb", type=float, default=50.0, help="size of the huge single-line file")
    args = ap.parse_args(argv)
    total = int(args.total_mb * (1 << 20)) if args.total_mb is not None else None
    summary = write_corpus(args.out, n=args.n, seed=args.seed, fmt=args.format, total_bytes=total,
                           shard_size=args.shard_size, metadata=not args.no_metadata,
                           max_chars=args.max_chars)
    report = {k: v for k, v in summary.items() if k != "files"}
    report["n_files"] = len(summary["files"])
    if args.bad:
        report["bad"] = write_bad_inputs(Path(args.out) / "bad", seed=args.seed,
                                         big_bytes=int(args.bad_big_mb * (1 << 20)))
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
