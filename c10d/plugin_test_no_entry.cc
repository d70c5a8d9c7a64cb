// A shared library without ferry_c10d_plugin_init, for plugin_test.
extern "C" int ferry_c10d_plugin_test_not_an_entry_point() { return 1; }
