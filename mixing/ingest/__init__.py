"""Reading sources into documents: files and formats, records and templates, tokenizers, the chunk cache."""
