"""The SQL dialect: tokenizer, statements, clauses, query shapes, frame statistics, quoted names."""
