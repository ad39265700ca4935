"""Retrieval floor: the embedder (``embedder``, ``embed_files``), FAISS + BM25 indexes and their fusion
(``index``), the retriever (``retriever``) and the cross-encoder reranker (``reranker``). No Ray."""
