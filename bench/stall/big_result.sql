select repeat('x', 2000000);
