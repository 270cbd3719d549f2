"""Payload values a face builds for the pipeline. Faces import only the pipeline (`agent.*`), never
`skills` directly (the import contracts in pyproject.toml), so the upload type they put into a
multipart call's payload is re-exported here from where the skills define it."""

from skills.uploads import UploadedFile as UploadedFile
