"""matrix.yaml -> typed, validated Cells: schema, positions, references, tags, serve commands."""
