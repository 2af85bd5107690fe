{"system_prompt": "Answer with a single word.", "user_prompt": "What is the capital of France?", "ground_truth": "Paris"}
{"system_prompt": "Answer with a single word.", "user_prompt": "What color is a clear daytime sky?", "ground_truth": "blue"}
{"system_prompt": "Answer with a number.", "user_prompt": "How many legs does a spider have?", "ground_truth": "8"}
{"system_prompt": "Answer with a single word.", "user_prompt": "What is frozen water called?", "ground_truth": "ice"}
{"system_prompt": "Answer with a number.", "user_prompt": "How many days are in a week?", "ground_truth": "7"}
