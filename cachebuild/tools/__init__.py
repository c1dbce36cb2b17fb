"""The tools that read a finished cache: ``verify`` (every byte, through the loader's decoder),
``inspect`` (summary and one record) and ``stage`` (copy into RAM, checked). All of them read
through the one reader of the format (:mod:`cachebuild.format.reader`, :mod:`~cachebuild.format.decode`,
:mod:`~cachebuild.format.records`)."""
