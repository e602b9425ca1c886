"""hpc_codegen/code_blocks.py: a completion's function body ends where the function does."""
from __future__ import annotations

from hpc_codegen.code_blocks import c_body_closed, extract_c_body, extract_python_body


def test_extract_c_body_stops_at_function_end():
    text = '  char c = \'}\'; /* } */ if (x) { y(); } // }\n  return 1;\n}\nint main(void) { return 0; }\n'
    assert extract_c_body(text) == '  char c = \'}\'; /* } */ if (x) { y(); } // }\n  return 1;\n}\n'
    assert extract_c_body("  return 1;\n```\nexplanation") == "  return 1;\n}\n"  # unclosed: close it
    assert c_body_closed("x(); }") and not c_body_closed("if (a) { b(); }")
    assert extract_python_body("    return 1\n\ndef other():\n    pass\n") == "    return 1\n"
