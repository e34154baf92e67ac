"""Command-line programs: `vit-keras NAME` installed, `python -m apps.NAME` in a checkout.

Importing the package and building a program's parser import neither Keras nor TensorFlow,
so --help answers at once; a program imports them once its arguments are parsed, quietly
unless --verbose (apps.common.import_keras)."""
