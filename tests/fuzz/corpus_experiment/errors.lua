local t = {}
for i = 1, 10 do t[i] = i * 1e-3 end
return experiment { name = "bad name!", model = 3, task = classify {}, sweep = grid { lr = t, nope = {1} }, seeds = {} }
