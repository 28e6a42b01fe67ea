// The layer link checks' program (CMakeLists.txt, tilegrad_layer): empty; what matters is that a
// layer's objects link against its declared dependencies alone.
int main() { return 0; }
