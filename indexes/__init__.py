"""Frame embedders and the TASTI index: representatives, FAISS k-NN, score propagation."""
