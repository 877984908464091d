"""spatialc.lower.cuda: the CUDA forms, one package each (`persistent/`, `general/`, `sm90a/`, the last built on the
general form's kernel and printer), what they share (`common/`), and `forms.py`, which picks the form that prints a
program."""
