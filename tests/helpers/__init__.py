"""What the tests share: throwaway projects, the in-process CLI, patches written without forktool's formatter."""
